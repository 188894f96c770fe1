"""Lazy tensors meeting CPU tensors, and ops that must run eagerly (issue #24, items 10 and 11)."""
import warnings

import pytest
import torch
from conftest import assert_same



# -- 10: a lazy tensor written into a CPU tensor ----------------------------------
def test_copy_into_cpu_tensor_is_a_partial_sync(dev):
    t = torch.tensor([3., 6.], device=dev)
    pending = t * 2  # other pending work stays pending, nothing is donated
    cpu = torch.zeros(2)
    assert cpu.copy_(t) is cpu
    torch.testing.assert_close(cpu, torch.tensor([3., 6.]))
    ints = torch.zeros(2, dtype=torch.int64)
    ints.copy_(t)  # with eager's cast
    assert ints.tolist() == [3, 6]
    assert_same(pending, torch.tensor([6., 12.]))
    assert_same(t, torch.tensor([3., 6.]))


def test_setitem_of_cpu_tensor_from_lazy(dev):
    t = torch.tensor([3., 6.], device=dev)
    cpu = torch.zeros(2)
    cpu[:] = t
    torch.testing.assert_close(cpu, torch.tensor([3., 6.]))
    cpu = torch.zeros(2)
    cpu[0] = t[1]
    torch.testing.assert_close(cpu, torch.tensor([6., 0.]))


@pytest.mark.parametrize("write", [
    lambda cpu, t: cpu.add_(t),
    lambda cpu, t: torch.add(torch.ones(2), t, out=cpu),
    lambda cpu, t: torch.add(t, t, out=cpu),
    lambda cpu, t: cpu.mul_(t),
], ids=["add_", "add_out_mixed", "add_out_lazy", "mul_"])
def test_other_writes_into_cpu_tensor_raise_eagers_error(dev, write):
    t = torch.tensor([3., 6.], device=dev)
    cpu = torch.zeros(2)
    with pytest.raises(RuntimeError, match=r"same device.*lazy:0 and cpu.*test_mixed_devices.py.*\.cpu\(\)"):
        write(cpu, t)
    assert cpu.tolist() == [0., 0.]
    assert_same(t + 1, torch.tensor([4., 7.]))  # the session keeps working


def test_tensor_from_a_list_of_lazy_scalars(dev):
    t = torch.tensor([3., 6.], device=dev)
    made = torch.tensor([t[0], t[1]])
    assert made.device.type == "cpu"
    torch.testing.assert_close(made, torch.tensor([3., 6.]))
    torch.testing.assert_close(torch.tensor([[t[0]], [t[1] * 2]]), torch.tensor([[3.], [12.]]))


def test_equal_across_devices_raises(dev):
    t = torch.tensor([3., 6.], device=dev)
    with pytest.raises(RuntimeError, match=r"same device.*lazy:0 and cpu"):
        torch.equal(t, torch.tensor([3., 6.]))
    assert torch.equal(t, torch.tensor([3., 6.], device=dev))


# -- 11: ops that must run eagerly ------------------------------------------------
def test_repeat_interleave_by_a_lazy_tensor_runs_eagerly(dev):
    got = torch.arange(3., device=dev).repeat_interleave(torch.tensor([1, 2, 3], device=dev))
    assert_same(got, torch.arange(3.).repeat_interleave(torch.tensor([1, 2, 3])))


def _outcome(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            value = fn()
        except RuntimeError as e:
            value = e
    return value, sorted(str(w.message) for w in caught if "xlakit" not in str(w.message))


def test_uint8_mask_index_matches_eager(dev):
    mask = [1, 0, 1, 0]
    eager, eager_warnings = _outcome(lambda: torch.arange(4.)[torch.tensor(mask, dtype=torch.uint8)])
    got, got_warnings = _outcome(lambda: torch.arange(4., device=dev)[torch.tensor(mask, dtype=torch.uint8, device=dev)])
    assert_same(got, eager)
    assert got_warnings == eager_warnings and eager_warnings


def test_uint8_mask_write_matches_eager(dev):
    def write(device):
        x = torch.arange(4., device=device)
        x[torch.tensor([1, 0, 1, 0], dtype=torch.uint8, device=device)] = 7
        return x
    eager, _ = _outcome(lambda: write("cpu"))
    got, _ = _outcome(lambda: write(dev))
    assert isinstance(eager, RuntimeError) and isinstance(got, RuntimeError)
    assert str(eager) in str(got)
    assert_same(torch.arange(4., device=dev) + 1, torch.arange(4.) + 1)  # the session keeps working


def test_cpu_tensor_without_a_cpu_contract_still_raises(dev):
    with pytest.raises(RuntimeError, match=r"aten.mm.default: expected all tensors to be on the same device"):
        torch.ones(2, 2, device=dev) @ torch.ones(2, 2)


@pytest.mark.parametrize("cell", [torch.nn.LSTM, torch.nn.GRU])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("lengths", [[5, 3], [2, 5]])
def test_packed_rnns_train_as_in_eager(dev, cell, batch_first, lengths):
    # pack_padded_sequence takes its lengths on the CPU, and keeps the batch sizes there
    from torch.nn.utils.rnn import pack_padded_sequence, pack_sequence, pad_packed_sequence

    def run(device):
        torch.manual_seed(0)
        rnn = cell(4, 3, batch_first=batch_first, bidirectional=True).to(device)
        x = torch.randn((2, 5, 4) if batch_first else (5, 2, 4)).to(device).requires_grad_()
        packed = pack_padded_sequence(x, torch.tensor(lengths), batch_first=batch_first, enforce_sorted=False)
        out, _ = rnn(packed)
        y, out_lengths = pad_packed_sequence(out, batch_first=batch_first, total_length=6)
        (y * torch.arange(6.).to(device).view((1, 6, 1) if batch_first else (6, 1, 1))).sum().backward()
        seq = pack_sequence([torch.arange(6.).view(3, 2).to(device), torch.ones(2, 2).to(device)])
        return y, out_lengths, x.grad, rnn.weight_ih_l0.grad, seq.batch_sizes, seq.data

    for got, want in zip(run(dev), run("cpu")):
        assert got.device.type == ("cpu" if want.dtype == torch.int64 else "lazy")
        assert_same(got, want, rtol=1e-5, atol=1e-6)
