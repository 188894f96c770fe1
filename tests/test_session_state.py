"""Session state shared across calls: per-thread captures, the bound on unread checks."""
import threading

import torch

import xlakit


def test_capture_collects_only_its_own_threads_steps(dev):
    barrier = threading.Barrier(2, timeout=60)
    captured, errors = {}, []

    def worker(name, scale):
        try:
            x = torch.full((3,), float(scale)).to(dev)
            with xlakit.capture() as steps:
                barrier.wait()                   # both captures are open
                for _ in range(scale):
                    x = x + 1
                    (x * 2).sum().item()
                barrier.wait()                   # both threads' syncs ran while both were open
                with xlakit.capture() as inner:  # nesting still works per thread
                    x.sum().item()
            captured[name] = (steps, inner)
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(name, n)) for name, n in (("a", 2), ("b", 3))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    (a, a_inner), (b, b_inner) = captured["a"], captured["b"]
    assert [r.trigger for r in a] == ["item"] * 3 and [r.trigger for r in b] == ["item"] * 4
    assert not {r.index for r in a} & {r.index for r in b}
    assert a_inner == a[-1:] and b_inner == b[-1:]
