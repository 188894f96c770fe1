"""A fork server for the tests that run programs in a new Python process (tests/conftest.py's
`new_python`). It imports torch and jax once; each request forks a child that runs one program
as `python -c PROGRAM` or `python SCRIPT ARGS...` would, with its own environment, working
directory, and stdout and stderr (named pipes the test reads). Each child is a new process that skips the imports: xlakit is never
imported here, no JAX backend or cache has started, and nothing a child does comes back.
A child's sys.path follows its PYTHONPATH; what else Python reads when it starts (PYTHONHASHSEED,
-X options) is this server's: a test that varies those starts `python` itself.

Requests are JSON lines on stdin; each answer is a line with the child's exit status
(negative: the signal that ended it, as subprocess says).
"""
import json
import os
import runpy
import signal
import sys
import types

import jax  # noqa: F401  (imported only: a child starts its own backends)
import torch  # noqa: F401


def python_path(env) -> list[str]:
    return [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


def run(request: dict) -> None:
    os.dup2(os.open(request["stdout"], os.O_WRONLY), 1)  # first: the test waits on these pipes
    os.dup2(os.open(request["stderr"], os.O_WRONLY), 2)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    sys.path[1:] = python_path(request["env"]) + [p for p in sys.path[1:] if p not in python_path(os.environ)]
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    if request["timeout"]:
        signal.alarm(request["timeout"])  # a child that hangs ends with SIGALRM
    argv = request["argv"]
    if argv[0] == "-c":
        sys.argv, sys.path[0] = ["-c", *argv[2:]], ""
        main = sys.modules["__main__"] = types.ModuleType("__main__")
        exec(compile(argv[1], "<string>", "exec"), main.__dict__)
    else:
        sys.argv, sys.path[0] = argv, os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        run(request)
        break  # the child ends as a program does: its exceptions and exit handlers as python's own
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
