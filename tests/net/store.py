"""Where the refactor safety net keeps its snapshots, and as what text: what a diff reads.

expected/torch-<minor>/<program>.json   the steps: trigger, cache outcome, key components,
                                        donors. They depend on torch (its decompositions and
                                        Dynamo's graphs: torch 2.13's compiled step differs),
                                        not on jax (the Colab column's jax 0.7.2 gives the same).
expected/<HLO_COLUMN>/<program>.hlo     each executable's optimized HLO, and keys.json: the
                                        keys, with the backend they were made under. Stored for
                                        one column only, `make test`'s: the HLO moves with jax and
                                        torch, and a Llama step's is ~380 kB a column.
"""
import json
from pathlib import Path

EXPECTED = Path(__file__).with_name("expected")
HLO_COLUMN = ("2.9", "0.10.2")  # torch minor, jax
REGENERATE = "python -m tests.net.regenerate"


def torch_minor(backend: dict) -> str:
    return ".".join(backend["torch"].split("+")[0].split(".")[:2])


def steps_dir(backend: dict) -> Path:
    return EXPECTED / f"torch-{torch_minor(backend)}"


def hlo_dir() -> Path:
    return EXPECTED / "torch-{}-jax-{}".format(*HLO_COLUMN)


def stores_hlo(backend: dict) -> bool:
    return (torch_minor(backend), backend["jax"]) == HLO_COLUMN


def steps_text(snapshot: dict) -> str:
    steps = [{k: v for k, v in step.items() if k != "key"} for step in snapshot["steps"]]
    return json.dumps(steps, indent=1, sort_keys=True) + "\n"


def hlo_text(snapshot: dict) -> str:
    return "".join(f"// executable {i}\n{hlo}\n" for i, hlo in enumerate(snapshot["hlo"]))


def keys_text(backend: dict, snapshots: dict) -> str:
    keys = {name: [step["key"] for step in s["steps"]] for name, s in snapshots.items()}
    return json.dumps({"backend": backend, "keys": keys}, indent=1, sort_keys=True) + "\n"
