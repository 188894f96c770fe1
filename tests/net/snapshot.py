"""What the refactor safety net stores of a program, and how it is taken.

`python tests/net/snapshot.py OUT PROGRAM...` runs each program (tests/net/net_programs.py, all with the same device count) in this fresh process,
after xlakit.reset(), and writes {program: snapshot} to OUT as JSON.

A snapshot is, per step record: the trigger, the cache outcome, the key components that say
what was compiled (graph, inputs, donors, flags, shardings), the components a miss named, the
donated buffers, and which of the program's executables ran; beside them, each executable's
optimized HLO with its source locations removed. Left out: `backend` (python, jax, jaxlib,
torch and xlakit versions: it moves with the machine, not the code) and the key, which digests
`backend` too; the key is kept with the backend it was made under and compared only there.
Also left out: timings, sources and record indices (they depend on the run or on this
directory's line numbers).
"""
import json
import os
import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parent.parent)]  # programs, tests/, xlakit

STORED_COMPONENTS = ("graph", "inputs", "donors", "flags", "shardings")
BACKEND_KEYS = ("python", "platform", "device_kind", "jax", "jaxlib", "torch", "xlakit")

# Source locations of the tracing Python (xlakit's and the program's lines): any edit above
# moves them, and they change no compiled code.
_LOCATION_TABLES = re.compile(r"^(FileNames|FunctionNames|FileLocations|StackFrames)\n(.+\n)*\n", re.M)
_LOCATION_ATTRS = re.compile(r" ?\b(stack_frame_id|source_file|source_line|source_end_line|source_column"
                             r"|source_end_column)=(\"[^\"]*\"|\d+)")


def environment(devices: int) -> dict[str, str]:
    """The process's settings: the suite's XLA_FLAGS (tests/conftest.py's, so the flags component
    is the suite's), `devices` host devices, and no disk cache (every first compile a miss).
    The fast-math flag is the one torch_xla adds to XLA_FLAGS when it is imported (transformers
    imports it where installed): given from the start, the key's flags do not depend on whether,
    or when, it was imported."""
    flags = "--xla_backend_optimization_level=0 --xla_cpu_enable_fast_math=false"
    if devices > 1:
        flags += f" --xla_force_host_platform_device_count={devices}"
    return {"XLA_FLAGS": flags, "XLAKIT_CACHE_DIR": "", "PJRT_DEVICE": "CPU"}


def strip_hlo(hlo: str) -> str:
    return _LOCATION_ATTRS.sub("", _LOCATION_TABLES.sub("", hlo)).replace(", metadata={}", "")


def snapshot(records) -> dict:
    executables, hlos, steps = {}, [], []
    for r in records:
        if r.key not in executables:
            executables[r.key] = len(hlos)
            hlos.append(strip_hlo(r.hlo or ""))
        steps.append({
            "trigger": str(r.trigger), "cache": str(r.cache),
            "components": {name: r.components[name] for name in STORED_COMPONENTS},
            "changed": list(r.changed),
            "donated": [f"input {d.index} ({d.label}): {d.dtype}{list(d.shape)}, {d.nbytes} bytes" for d in r.donated],
            "executable": executables[r.key], "key": r.key,
        })
    return {"steps": steps, "hlo": hlos}


def take(python) -> tuple[dict, dict]:
    """(backend, {program: snapshot}) of every program, each device group in a fresh process:
    `python(*argv)` runs `python argv...` and returns its subprocess.CompletedProcess."""
    import net_programs

    backend, snapshots = None, {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, names in enumerate(net_programs.groups()):
            out = Path(tmp, f"{i}.json")
            done = python(__file__, str(out), *names)
            assert done.returncode == 0, f"tests/net/snapshot.py {' '.join(names)}:\n{done.stderr[-3000:]}"
            result = json.loads(out.read_text())
            backend = result["backend"]
            snapshots.update(result["programs"])
    return backend, snapshots


def main(out: str, names: list[str]) -> None:
    import net_programs

    devices = {net_programs.PROGRAMS[name][1] for name in names}
    assert len(devices) == 1, f"one device count per process: {names}"
    os.environ.update(environment(devices.pop()))

    import xlakit
    from xlakit.engine import keys

    snapshots = {}
    for name in names:
        xlakit.reset()
        with xlakit.capture() as records:
            net_programs.PROGRAMS[name][0]()
        snapshots[name] = snapshot(records)
    backend = keys.backend_description()
    Path(out).write_text(json.dumps({"backend": {k: backend[k] for k in BACKEND_KEYS}, "programs": snapshots}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
