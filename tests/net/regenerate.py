"""Writes the refactor safety net's snapshots for this interpreter's column (tests/net/store.py):
`python -m tests.net.regenerate` from the repository root, once per column that stores them
(.venv for torch 2.9 and the HLO, .venv-latest for torch 2.13). A commit that changes them
says why."""
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import snapshot  # noqa: E402
import store  # noqa: E402


def _rewrite(folder: Path, files: dict[str, str]) -> None:
    """`folder` holds exactly `files` (a removed program leaves nothing behind)."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        old.unlink()
    for name, text in files.items():
        (folder / name).write_text(text)


def main() -> None:
    backend, snapshots = snapshot.take(lambda *argv: subprocess.run([sys.executable, *argv], capture_output=True, text=True))
    _rewrite(store.steps_dir(backend), {f"{name}.json": store.steps_text(s) for name, s in snapshots.items()})
    written = [store.steps_dir(backend)]
    if store.stores_hlo(backend):
        files = {f"{name}.hlo": store.hlo_text(s) for name, s in snapshots.items()}
        _rewrite(store.hlo_dir(), {**files, "keys.json": store.keys_text(backend, snapshots)})
        written.append(store.hlo_dir())
    print("wrote", *written)


if __name__ == "__main__":
    main()
