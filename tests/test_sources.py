"""Each node keeps the user's line and the library line that recorded it; warnings
and views name them as a person reads them."""
import os
import sys
import weakref

import pytest
import torch
import torch.nn.functional as F

import xlakit
from xlakit.core import module_paths, sources
from xlakit.core.record import Trigger
from xlakit.lowerings import eager
from xlakit.session import current

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")


def tiny_gpt2():
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=16)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


def test_nodes_keep_the_user_line_and_the_library_line(dev):
    model = tiny_gpt2().to(dev)
    ids = torch.tensor([[1, 2, 3]]).to(dev)
    line = test_nodes_keep_the_user_line_and_the_library_line.__code__.co_firstlineno + 4
    logits = model(ids).logits  # the user's line: every node has it
    xlakit.sync([logits])
    nodes = xlakit.last_step().graph.nodes
    assert {n.source.user.file for n in nodes} == {__file__}
    assert {n.source.user.line for n in nodes} == {line}
    libraries = {os.path.basename(n.source.library.file) for n in nodes}
    assert "modeling_gpt2.py" in libraries, libraries
    assert not any(f.startswith(("torch", "xlakit")) for f in libraries)  # the machinery is never "the line"
    block = next(n for n in nodes if n.source.library.file.endswith("modeling_gpt2.py"))
    assert sources.describe(block.source) == (
        f"test_sources.py:{line} -> modeling_gpt2.py:{block.source.library.line} in forward")


class _UserActivation(torch.nn.Module):
    """User code that a library module calls (the user's line is then inside the library's call)."""

    def forward(self, x):
        return torch.tanh(x) * 0.5


def test_every_op_names_the_lines_its_whole_stack_gives(dev, monkeypatch):
    """capture() walks an op's stack only down to the innermost module's caller and reads the
    rest from that call's first walk (module_paths.Entry), and reuses the last op's Source where
    its lines and module are the same: each op's lines must be what the whole stack, read by the
    traceback module, gives, and its module path module_paths.current()'s. A library model called
    from two user lines of one step, a user module inside it, backward and an optimizer step."""
    import traceback

    from xlakit.core.ir import Frame

    model = tiny_gpt2().train()
    model.transformer.h[0].mlp.act = _UserActivation()
    model = model.to(dev)
    opt = torch.optim.AdamW(model.parameters())
    ids = torch.tensor([[1, 2, 3]]).to(dev)
    captured, expected = [], []

    def check(source, stack):
        user = library = None  # the rule, read off the whole stack: the innermost user line, the innermost library line below it
        for f in reversed(stack):
            kind = sources._kind(f.filename)
            if kind == sources.USER:
                user = Frame(f.filename, f.lineno, f.name)
                break
            if kind == sources.LIBRARY and library is None:
                library = Frame(f.filename, f.lineno, f.name)
        captured.append((source.user, source.library, source.module) if source is not None else (None, None, ""))
        expected.append((user, library, module_paths.current()))

    # compiled under a "<...>" name, machinery as torch's generated code is: not the user's line itself
    space = {"real": sources.capture, "check": check, "extract_stack": traceback.extract_stack}
    exec(compile("def both(skip=1):\n    source = real(skip + 1)\n    check(source, extract_stack()[:-1])\n    return source\n",
                 "<capture check>", "exec"), space)
    both = space["both"]

    monkeypatch.setattr(sources, "capture", both)
    for _ in range(3):  # recorded, then replayed
        loss = model(ids, labels=ids).loss
        loss = loss + model(ids, labels=ids).loss  # the same modules from another line
        loss.backward()
        opt.step()
        opt.zero_grad()
        xlakit.mark_step()
    assert len(captured) > 300 and any(user is not None and user.function == "forward" for user, _, _ in captured)
    assert captured == expected


def test_a_function_defined_again_with_its_lines_moved_names_its_new_lines(dev):
    """A walk reads a frame's line once per (code object, instruction offset) (sources._frame_of):
    a cell run again with lines added above its function makes a new code object in the same file,
    with the same instructions, perhaps where a dead one lay; each step, recorded or replayed, names
    the line its own code has, and a function that did not change keeps its line."""
    x = torch.ones(3).to(dev)
    kept = {}
    exec(compile("def g(x):\n    return x + 1\n", "/user/kept_cell.py", "exec"), kept)
    for blank_lines in (0, 3, 3, 1, 0, 5):
        space = {}
        exec(compile("\n" * blank_lines + "def f(x):\n    return x * 2\n", "/user/cell.py", "exec"), space)
        y = kept["g"](space["f"](x))
        xlakit.sync([y])
        lines = {n.op: n.source.user.line for n in xlakit.last_step().graph.nodes}
        assert lines == {"aten.mul.Tensor": blank_lines + 2, "aten.add.Tensor": 2}, (blank_lines, lines)
        del space, y


_LIBRARY_FILE = "/site-packages/fake_library/ops.py"  # classified a library's in the tests below (sources._KIND)


def _library(code: str) -> dict:
    space = {}
    exec(compile(code, _LIBRARY_FILE, "exec"), space)
    return space


def test_one_library_line_called_from_two_user_lines_names_each_caller(dev, monkeypatch):
    """capture() reuses what it found at an instruction of the frame the last op came from
    (sources._Capturing.frame): a library function called from two user lines runs in a new
    frame per call, each a new object, though a returned one's memory is the next one's. Each
    node names its own caller, recorded and replayed."""
    monkeypatch.setitem(sources._KIND, _LIBRARY_FILE, sources.LIBRARY)
    double = _library("def double(x):\n    return x * 2\n")["double"]
    x = torch.ones(3).to(dev)
    first = sys._getframe().f_lineno + 2  # the first call's line
    for _ in range(3):  # recorded, then replayed
        y = double(x)
        y = double(y)
        xlakit.mark_step()
        lines = [(n.source.user.line, n.source.library.line) for n in xlakit.last_step().graph.nodes]
        assert lines == [(first, 2), (first + 1, 2)]


def test_two_backward_calls_from_two_user_lines_name_each_caller(dev):
    """capture() reuses the frames a backward op's walk found at an instruction of the frame the
    last op came from (autograd's engine calls each op of a backward from one frame and instruction,
    a new frame per backward): each backward's ops name the line that called it, the line of the
    forward op whose gradient they compute, recorded and replayed."""
    w = torch.ones(3).to(dev).requires_grad_()
    for _ in range(3):
        line = sys._getframe().f_lineno + 1
        twice, thrice = (w * 2).sum(), (
            w * 3).sum()
        twice.backward()  # the two backward calls, back to back
        thrice.backward()
        xlakit.mark_step()
        backward = [n.source for n in xlakit.last_step().graph.nodes if n.source.forward is not None]
        assert {(s.forward.user.line, s.user.line) for s in backward} == {(line, line + 2), (line + 1, line + 3)}
        w.grad = None


def test_a_library_generator_resumed_from_two_user_lines_names_each_caller(dev, monkeypatch):
    """A generator's frame stays one object while callers resume it from other lines: the
    frame capture() reuses what it found in is never a generator's."""
    monkeypatch.setitem(sources._KIND, _LIBRARY_FILE, sources.LIBRARY)
    doubling = _library("def doubling(x):\n    while True:\n        x = yield x * 2\n")["doubling"]
    x = torch.ones(3).to(dev)
    steps = doubling(x)
    y = next(steps)  # the op at the generator's one instruction, from this line
    xlakit.mark_step()
    first = sys._getframe().f_lineno + 2  # the first resumption's line
    for _ in range(3):
        y = steps.send(y)
        y = steps.send(y)
        xlakit.mark_step()
        assert [n.source.user.line for n in xlakit.last_step().graph.nodes] == [first, first + 1]


def test_what_only_a_returned_function_held_is_not_computed_by_the_next_step(dev):
    """capture() keeps the frame the last op came from until the next op from another frame or
    the next sync: a function that returned keeps its locals that long, and no longer. Its
    scratch tensor dies at the step marker, before the step reads what is live."""
    x = torch.ones(3).to(dev)
    scratch_refs = []

    def plus_one(x):
        scratch = x * 3  # the function's last op: capture keeps this frame
        scratch_refs.append(weakref.ref(scratch))
        return x + 1

    for _ in range(3):
        y = plus_one(x)
        # the engine's marker itself, which no capture of the caller's line comes before
        current().sync(trigger=Trigger.MARK_STEP, source="a test's marker")
        assert scratch_refs[-1]() is None
        assert [n.op for n in xlakit.last_step().graph.nodes] == ["aten.add.Tensor"]
        assert torch.equal(y.cpu(), torch.full((3,), 2.0))


def test_code_of_the_user_has_no_library_line(dev):
    linear = torch.nn.Linear(3, 2).to(dev)
    y = linear(torch.ones(3).to(dev))
    xlakit.sync([y])
    node = xlakit.last_step().graph.nodes[-1]
    assert node.source.user.file == __file__ and node.source.library is None


def test_fallback_warning_is_attributed_to_the_user_line(dev, monkeypatch):
    monkeypatch.setattr(eager, "WARNED", set())  # each op warns once per process
    x = torch.tensor([1.0, -1.0, 2.0], device=dev)
    line = test_fallback_warning_is_attributed_to_the_user_line.__code__.co_firstlineno + 5
    with pytest.warns(UserWarning, match="runs eagerly") as caught:
        torch.nonzero(x > 0)
    assert caught[0].filename == __file__ and caught[0].lineno == line
    assert f"at test_sources.py:{line};" in str(caught[0].message)


def test_a_notebook_cell_reads_as_cell_n_line_m(monkeypatch):
    from IPython.core.interactiveshell import InteractiveShell

    monkeypatch.setattr(eager, "WARNED", set())
    shell = InteractiveShell.instance()
    shell.run_cell("import torch, warnings, xlakit\ndev = xlakit.device()", store_history=True)
    number = shell.execution_count
    result = shell.run_cell(
        "x = torch.tensor([1.0, -1.0], device=dev)\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    nz = torch.nonzero(x > 0)\n"
        "y = (x * 2).sum()\n"
        "xlakit.sync([y])\n", store_history=True)
    result.raise_error()
    caught = shell.user_ns["caught"]
    assert [(w.filename, w.lineno) for w in caught] == [(f"cell {number}", 4)]
    assert f"at cell {number} line 4;" in str(caught[0].message)
    record = xlakit.last_step()
    assert record.source == f"cell {number} line 6"
    assert sources.describe(record.graph.nodes[-1].source) == f"cell {number} line 5"


def test_cell_numbers_in_a_real_kernel():
    # ipykernel counts the next cell in execution_count while a cell runs; the
    # lines of a %%xla_step cell must still read as that cell's number
    nbclient, nbformat = pytest.importorskip("nbclient"), pytest.importorskip("nbformat")
    body = "%%xla_step --quiet\ny = (x * 2).sum()"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("%load_ext xlakit\nimport torch, xlakit\nfrom xlakit.core import sources\n"
                                          "x = torch.ones(3).to(xlakit.device())"),
                nbformat.v4.new_code_cell(body), nbformat.v4.new_code_cell(body),
                nbformat.v4.new_code_cell("r = xlakit.last_step()\n"
                                          "print(r.source, '|', sources.describe(r.graph.nodes[-1].source))")]
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    assert [c.execution_count for c in nb.cells] == [1, 2, 3, 4]
    assert nb.cells[3].outputs[0]["text"] == "cell 3 line 1 | cell 3 line 1\n"


def _with_a_fallback(x):
    y = x.sin()
    z = F.interpolate((y - 1).view(1, 1, 1, 3), size=(1, 2), mode="bilinear", antialias=True)  # no lowering: eager
    return z * 3


def test_compiled_nodes_and_warnings_keep_their_own_lines(dev, monkeypatch):
    # torch.compile's backend runs FX nodes; each keeps the line Dynamo recorded
    # for it, not the line of the frame Dynamo runs (the def, or a resume point)
    monkeypatch.setattr(eager, "WARNED", set())
    torch._dynamo.reset()
    first = _with_a_fallback.__code__.co_firstlineno
    with xlakit.capture() as steps, pytest.warns(UserWarning, match="_upsample_bilinear2d_aa.default runs eagerly") as caught:
        torch.compile(_with_a_fallback, backend="xlakit")(torch.ones(3))  # Dynamo takes host tensors
    lines = {str(n.op): n.source.user.line for r in steps for n in r.graph.nodes}
    assert lines["aten.sin.default"] == first + 1 and lines["aten.sub.Tensor"] == first + 2, lines
    assert lines["aten.mul.Tensor"] == first + 3, lines
    assert [w.lineno for w in caught if "_upsample_bilinear2d_aa" in str(w.message)] == [first + 2]


def test_fx_nodes_of_a_torch_module_name_no_line_of_torch():
    # Dynamo's stack trace of a torch.nn module's op holds only torch's and its own
    # frames (external_utils.py): no line of them is the user's or a library's; the
    # module path comes from nn_module_stack
    from xlakit.integrations import dynamo

    torch._dynamo.reset()
    with dynamo.compiled_graphs() as graphs:
        torch.compile(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU()), backend="xlakit")(torch.ones(2, 4))
        torch.compile(_scaled, backend="xlakit")(torch.ones(3))
    module, function = (g.graph for g in graphs)
    assert [(n.source.user, n.source.library) for n in module.nodes] == [(None, None)] * len(module.nodes)
    paths = [n.source.module for n in module.nodes]  # Linear's nodes, then ReLU's (their count varies by torch)
    assert paths == sorted(paths) and paths[0] == "0" and paths[-1] == "1" and set(paths) == {"0", "1"}, paths
    assert {(n.source.user.file, n.source.user.line) for n in function.nodes} == \
        {(__file__, _scaled.__code__.co_firstlineno + 1)}


def _scaled(x):
    return (x * 2).sin()
