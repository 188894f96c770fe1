"""xlakit.reset(): everything the process keeps (core/state.py) is emptied, each entry
stays within its bound, and after a reset this process and a fresh one give the
same records and keys for the same program."""
import gc
import json
import runpy
import subprocess
import sys
import textwrap

import pytest
import torch

import xlakit
import xlakit.analysis.flops  # noqa: F401 - the modules that register state, all imported
import xlakit.integrations.dynamo  # noqa: F401
import xlakit.notebook.graph_dot  # noqa: F401
import xlakit.notebook.magics  # noqa: F401
from xlakit.core.state import PROCESS, Last, Memo, Seen

# A training step run twice, then an op that runs eagerly (it warns once per process).
PROGRAM = textwrap.dedent('''
    import json, warnings
    import torch, xlakit

    def run():
        dev = xlakit.device()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with warnings.catch_warnings(record=True) as caught, xlakit.capture() as steps:
            warnings.simplefilter("always")
            for _ in range(2):
                model(torch.ones(2, 4).to(dev)).square().mean().backward()
                opt.step()
                opt.zero_grad()
                xlakit.mark_step()
            torch.arange(6, device=dev).nonzero().cpu()
        return {
            "records": [{
                "index": s.index, "trigger": str(s.trigger), "cache": str(s.cache), "key": s.key,
                "components": s.components, "metadata": s.metadata_digest, "changed": list(s.changed),
                "uses": s.uses, "cache_entries": s.cache_entries, "hit_rate": s.hit_rate,
                "donated": [(d.index, d.nbytes) for d in s.donated], "source": s.source,
                "nodes": [(n.op, n.operands, n.avals, n.args, n.module, repr(n.source)) for n in s.graph.nodes],
            } for s in steps],
            "metrics": xlakit.metrics(),
            "warnings": [str(w.message) for w in caught if "xlakit" in str(w.message)],
        }

    if __name__ == "__main__":
        print(json.dumps(run()))
''')


def _in_fresh_process(path) -> dict:
    result = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def test_after_reset_this_process_gives_what_a_fresh_one_gives(tmp_path):
    path = tmp_path / "program.py"
    path.write_text(PROGRAM)
    run = runpy.run_path(str(path))["run"]
    run()                      # other work: every memo, cache and warned-once set holds this program's
    other = torch.randn(5, 7).to(xlakit.device())
    (other @ other.T).sum().item()
    fresh = _in_fresh_process(path)   # the same disk cache: its steps load what this process stored
    xlakit.mark_step()         # nothing left pending from earlier tests joins the program's steps
    gc.collect()
    xlakit.reset()
    here = json.loads(json.dumps(run()))
    assert [r["cache"] for r in fresh["records"]][:2] == ["persistent_hit", "hit"]
    assert fresh["warnings"], "the eager op warns in a fresh process"
    assert here == fresh


def test_every_entry_is_empty_after_reset():
    dev = xlakit.device()
    x = torch.ones(3, 4).to(dev)
    (x * 2.5).sum().item()
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.warns(UserWarning, match="einsum"):
        torch.einsum("ij,kj->ik", x, x).cpu()   # warns once
    assert sum(PROCESS.sizes().values()) > 0
    xlakit.reset()
    assert {name: size for name, size in PROCESS.sizes().items() if size} == {}
    assert xlakit.steps() == [] and set(xlakit.metrics().values()) == {0}


def test_live_tensors_keep_their_values_across_reset():
    dev = xlakit.device()
    computed = torch.arange(4.0).to(dev) * 2
    xlakit.mark_step()
    pending = computed + 1
    xlakit.reset()
    assert torch.equal(pending.cpu(), torch.arange(4.0) * 2 + 1)
    assert torch.equal(computed.cpu(), torch.arange(4.0) * 2)
    assert [s.index for s in xlakit.steps()] == [0]   # the pending work's step, numbered afresh


def test_every_entry_stays_within_its_bound():
    bounded = [held for held in PROCESS.held() if isinstance(held.value, (Memo, Seen))]
    assert len(bounded) >= 10
    for held in bounded:
        for i in range(held.bound + 1):   # one past its bound; keys no program makes
            if isinstance(held.value, Seen):
                held.value.add(("filler", i))
            else:
                held.value[("filler", i)] = None
        assert held.size() == held.bound, held.name
        assert ("filler", held.bound) in held.value, held.name
        assert isinstance(held.value, Seen) or ("filler", 0) not in held.value, held.name  # a memo: the oldest went
    last = Last()
    last.put("a", 1)
    last.put("b", 2)
    assert len(last) == 1 and last.get(1) is None and last.get(2) == "b"
    xlakit.reset()
    assert sum(PROCESS.sizes().values()) == 0
