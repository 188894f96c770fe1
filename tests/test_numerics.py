"""config.check_nans: the op, module and line that made a step's first NaN or
infinity, found inside the step's executable; and rec.numerics's ranges."""
import inspect
import os
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import xlakit  # noqa: E402

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()


@pytest.fixture
def nans(monkeypatch):
    monkeypatch.setattr(xlakit.config, "check_nans", True)


def llama(dev, seed=0, layers=1):
    """A tiny transformers Llama; `layers=2` where a test tells one layer's module from its twin's."""
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    model = transformers.LlamaForCausalLM(cfg).to(dev)
    ids = torch.randint(0, 64, (2, 8)).to(dev)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3), dict(input_ids=ids, labels=ids)


def train(model, opt, batch, steps=1):
    for _ in range(steps):
        opt.zero_grad()
        loss = model(**batch).loss
        loss.backward()  # BACKWARD LINE
        opt.step()
        xlakit.mark_step()
    return loss


def line_of(function, marker: str) -> int:
    lines, start = inspect.getsourcelines(function)
    return start + next(i for i, text in enumerate(lines) if marker in text)


def plant_log(mlp):
    """The MLP's output gains log of a negative number: a NaN made in forward, in that module."""
    original = mlp.forward

    def planted(x):
        out = original(x)
        return out + torch.log(-out.abs().mean() - 1)  # PLANTED LOG
    mlp.forward = planted
    return line_of(plant_log, "PLANTED LOG")


def plant_sqrt(mlp):
    """sqrt(0) in forward is 0, its gradient is infinite: a non-finite value made only in backward."""
    original = mlp.forward

    def planted(x):
        out = original(x)
        return out + torch.sqrt(out * 0)  # PLANTED SQRT
    mlp.forward = planted
    return line_of(plant_sqrt, "PLANTED SQRT")


def test_a_nan_made_in_forward_names_its_op_module_and_line(dev, nans):
    model, opt, batch = llama(dev, layers=2)
    line = plant_log(model.model.layers[1].mlp)
    with pytest.raises(FloatingPointError) as raised:
        train(model, opt, batch)
    message = str(raised.value)
    assert f"aten.log.default in model.layers.1.mlp at test_numerics.py:{line}" in message
    assert "first NaN" in message and "input 0: min " in message
    found = xlakit.last_step().numerics.first_nonfinite
    assert (found.op, found.module, found.source.user.line, found.kind) == (
        "aten.log.default", "model.layers.1.mlp", line, "nan")
    low, high = found.inputs[0]
    assert low == high < 0   # log's input: the negated mean, one number
    # nothing is poisoned: the values are what XLA computed (NaN loss, NaN weights)
    assert model.lm_head.weight.isnan().all().item()


def test_a_nonfinite_value_made_in_backward_names_the_backward_module(dev, nans):
    model, opt, batch = llama(dev)
    line = plant_sqrt(model.model.layers[0].mlp)
    with pytest.raises(FloatingPointError, match=r"in backward\.model\.layers\.0\.mlp at test_numerics\.py:\d+"
                       rf", in the gradient of the forward op at test_numerics\.py:{line} in model\.layers\.0\.mlp"):
        loss = train(model, opt, batch)
    found = xlakit.last_step().numerics.first_nonfinite
    assert found.module == "backward.model.layers.0.mlp"
    assert found.source.user.line == line_of(train, "BACKWARD LINE")
    # the forward op whose gradient made it: sqrt's, at the planted line, in the module it ran in
    assert (found.source.forward.user.line, found.source.forward.module) == (line, "model.layers.0.mlp")
    loss = model(**batch).loss  # the forward pass alone makes nothing non-finite
    xlakit.mark_step()
    assert xlakit.last_step().numerics.first_nonfinite is None


def test_warn_mode_warns_and_the_step_goes_on(dev, monkeypatch):
    monkeypatch.setattr(xlakit.config, "check_nans", "warn")
    x = torch.linspace(-1, 1, 8).to(dev)
    xlakit.mark_step()
    y = (x - 0.5).log()
    with pytest.warns(RuntimeWarning, match=r"aten\.log\.default at test_numerics\.py:\d+ made the step's first NaN"):
        xlakit.mark_step()
    torch.testing.assert_close(y.cpu(), (torch.linspace(-1, 1, 8) - 0.5).log(), equal_nan=True)


def test_a_deliberate_infinity_is_no_origin(dev, nans):
    scores = torch.randn(4, 4).to(dev)
    mask = torch.ones(4, 4, dtype=torch.bool).triu(1).to(dev)
    probs = scores.masked_fill(mask, float("-inf")).softmax(-1)   # -inf asked for; softmax makes it 0
    xlakit.mark_step()
    assert xlakit.last_step().numerics.first_nonfinite is None
    assert probs.isfinite().all().item()


def test_only_a_step_whose_outputs_are_not_finite_is_searched(dev, nans):
    # as jax_debug_nans: the step's outputs are checked, and only a step whose outputs hold a
    # NaN or an infinity runs again, node by node, to find where it came from
    x = torch.linspace(-1, 1, 8).to(dev)
    xlakit.mark_step()
    y = torch.where(x > 0, x.log(), 0.0)   # a NaN made and dropped, as eager would never notice
    xlakit.mark_step()
    info = xlakit.last_step().numerics
    assert (info.nans_checked, info.searched, info.first_nonfinite) == (True, False, None)
    torch.testing.assert_close(y.cpu(), torch.where(x.cpu() > 0, x.cpu().log(), 0.0))
    for step in range(3):   # an output with a mask's -inf in it: searched once, then known to come from no op
        masked = x.masked_fill(x < 0, float("-inf"))
        xlakit.mark_step()
        info = xlakit.last_step().numerics
        assert (info.searched, info.first_nonfinite, info.nonfinite_outputs) == (step == 0, None, True), step
    from xlakit.notebook import render
    assert "no op of this step made" in render.text(xlakit.last_step())
    panel = dict(render.sections_html(xlakit.last_step(), None, hlo=False))["Numerics"]
    assert "Its outputs hold a NaN or infinity that no op of this step made" in panel
    assert masked.isinf().sum().item() == 4


def test_a_checked_step_donates_as_the_unchecked_one(dev, monkeypatch):
    # the guard keeps the search's inputs in the donated outputs themselves (a select fused into the
    # update): the step donates what it donates unchecked, and XLA's peak is the same (measured on
    # this step before: every buffer kept, peak 1.75x on bench/numerics.py's Llama)
    model, opt, batch = llama(dev)
    train(model, opt, batch, steps=2)
    off = xlakit.last_step()
    monkeypatch.setattr(xlakit.config, "check_nans", True)
    train(model, opt, batch, steps=2)
    on = xlakit.last_step()
    assert len(on.donated) == len(off.donated) > 0
    assert on.memory.peak <= 1.02 * off.memory.peak
    assert on.numerics.nans_checked and not on.numerics.searched


def test_a_searched_step_gives_eager_values_to_what_it_donated(dev, monkeypatch):
    # the step's outputs hold a NaN: its donated update kept its old value for the search, whose
    # outputs the tensors take, so the in-place update is eager's, not lost nor left undone
    monkeypatch.setattr(xlakit.config, "check_nans", "warn")
    w, x = torch.arange(4.0).to(dev), torch.linspace(-1, 1, 4).to(dev)
    xlakit.mark_step()
    w.mul_(3).add_(1)
    y = x.log()
    with pytest.warns(RuntimeWarning, match=r"aten\.log\.default at test_numerics\.py:\d+ made the step's first NaN"):
        xlakit.mark_step()
    record = xlakit.last_step()
    assert len(record.donated) == 1 and record.numerics.searched
    torch.testing.assert_close(w.cpu(), torch.arange(4.0) * 3 + 1)
    torch.testing.assert_close(y.cpu(), torch.linspace(-1, 1, 4).log(), equal_nan=True)


def test_a_backward_nan_is_searched_where_the_gradients_are_no_outputs(dev, nans):
    # zero_grad before the marker: the gradients are no outputs of the step, and the loss is finite;
    # the guard still checks them, as the values the backward pass hands to the donated updates
    torch.manual_seed(0)
    linear = torch.nn.Linear(4, 4).to(dev)
    opt = torch.optim.AdamW(linear.parameters(), lr=1e-3)
    x = torch.randn(2, 4).to(dev)
    out = linear(x)
    loss = (out + torch.sqrt(out * 0)).sum()  # SQRT LINE
    loss.backward()
    opt.step()
    opt.zero_grad()
    with pytest.raises(FloatingPointError, match=r"made the step's first"):
        xlakit.mark_step()
    found = xlakit.last_step().numerics.first_nonfinite
    assert found.module == "backward" and found.source.forward.user.line == line_of(
        test_a_backward_nan_is_searched_where_the_gradients_are_no_outputs, "SQRT LINE")
    assert loss.isfinite().item() and linear.weight.isnan().all().item()


def test_a_nan_made_by_a_donated_update_names_its_outputs_op(dev, monkeypatch):
    # made in the in-place update itself, from finite values: the donated buffer is written when
    # the guard is known, so the step is not searched; the update's op and line are named
    monkeypatch.setattr(xlakit.config, "check_nans", "warn")
    w = torch.linspace(-1, 1, 4).to(dev)
    xlakit.mark_step()
    w.log_()  # UPDATE LINE
    with pytest.warns(RuntimeWarning, match=r"outputs made by aten\.log\.default at test_numerics\.py:(\d+) hold a NaN"
                      ) as warned:
        xlakit.mark_step()
    assert f"test_numerics.py:{line_of(test_a_nan_made_by_a_donated_update_names_its_outputs_op, 'UPDATE LINE')}" \
        in str(warned[0].message)
    info = xlakit.last_step().numerics
    assert (info.searched, info.first_nonfinite, len(info.in_updates)) == (False, None, 1)
    torch.testing.assert_close(w.cpu(), torch.linspace(-1, 1, 4).log(), equal_nan=True)


PERSISTED = """
import torch, xlakit
xlakit.config.check_nans = True
x = torch.linspace(-1, 1, 8).to(xlakit.device())
xlakit.mark_step()
y = (x - 0.5).log()
try:
    xlakit.mark_step()
except FloatingPointError as e:
    print(xlakit.last_step().cache, "aten.log.default" in str(e))
"""


def test_an_executable_loaded_from_disk_searches_too(new_python, tmp_path):
    env = {**os.environ, "XLAKIT_CACHE_DIR": str(tmp_path)}
    runs = [new_python("-c", PERSISTED, env=env) for _ in range(2)]
    assert [r.stdout.split()[-2:] for r in runs] == [["miss", "True"], ["persistent_hit", "True"]], \
        [r.stderr[-2000:] for r in runs]


def test_no_false_report_over_twenty_steps_and_values_equal_the_flag_off(dev, monkeypatch):
    model, opt, batch = llama(dev)
    train(model, opt, batch, steps=2)
    off = xlakit.last_step()
    reference = {k: v.cpu() for k, v in model.state_dict().items()}

    monkeypatch.setattr(xlakit.config, "check_nans", True)
    model, opt, batch = llama(dev)
    train(model, opt, batch, steps=2)
    on = xlakit.last_step()
    # the values are the same computation's: XLA fuses the extra reductions in, and may round
    # a fused op's last bit differently (measured: 1e-9 on weights of 0.02)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value.cpu(), reference[name])
    # a different executable: the key differs in its flags only
    assert [c for c in on.components if on.components[c] != off.components[c]] == ["flags"]
    assert off.numerics is None and on.numerics.first_nonfinite is None

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with xlakit.capture() as steps:
            train(model, opt, batch, steps=18)
    assert [s.numerics.first_nonfinite for s in steps] == [None] * 18
    # the recording order, keyed with the flag, is the same each step: one executable from the second on
    assert len({s.key for s in steps[1:]}) == 1 and {s.cache for s in steps[1:]} == {"hit"}


def test_it_names_the_op_jax_debug_nans_names(dev, nans):
    def f(x):
        return jnp.exp(jnp.log(x - 2.0) * 2.0).sum()

    with jax.debug_nans(True), pytest.raises(FloatingPointError, match=r"invalid value \(nan\) encountered in log"):
        jax.jit(f)(jnp.linspace(0.0, 4.0, 8))
    x = torch.linspace(0.0, 4.0, 8).to(dev)
    xlakit.mark_step()
    total = ((x - 2.0).log() * 2.0).exp().sum()
    with pytest.raises(FloatingPointError, match=r"aten\.log\.default at test_numerics\.py"):
        xlakit.mark_step()
    assert total.isnan().item()


def test_ranges_name_each_module_and_its_dtype_limit(dev, monkeypatch):
    monkeypatch.setattr(xlakit.config, "record_ranges", True)
    model, opt, batch = llama(dev, layers=2)
    model.model.layers[1].mlp.down_proj.weight.data.mul_(1000)
    train(model, opt, batch)
    ranges = xlakit.last_step().numerics.ranges
    assert {"model.layers.1.mlp.down_proj", "backward.model.layers.1.mlp.down_proj", "optimizer"} <= set(ranges)
    big = ranges["model.layers.1.mlp.down_proj"]
    assert big.dtype == "f32" and big.limit == torch.finfo(torch.float32).max
    assert big.absmax > 100 * ranges["model.layers.0.mlp.down_proj"].absmax
    assert xlakit.last_step().numerics.by_module["model.layers.1.mlp.down_proj"] == big.absmax


def bf16_model(dev):
    """Three Linear layers in bfloat16: the first's values 1, the second's 2^125 (2^3 below bf16's
    largest), the third's all zero."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    with torch.no_grad():
        for layer, weight in zip(model, (1 / 8, 2.0 ** 122, 0.0)):
            layer.weight.fill_(weight)
            layer.bias.zero_()
    return model.to(dev, torch.bfloat16)


def test_numerics_panel_marks_the_module_near_overflow_and_the_one_underflowing(dev, monkeypatch):
    from xlakit.notebook import numerics_view, render
    monkeypatch.setattr(xlakit.config, "record_ranges", True)
    model = bf16_model(dev)
    out = model(torch.ones(2, 8, dtype=torch.bfloat16).to(dev))
    xlakit.mark_step()
    record = xlakit.last_step()
    ranges = record.numerics.ranges
    assert ranges["1"].dtype == "bf16" and numerics_view.near_overflow(ranges["1"])
    assert not numerics_view.near_overflow(ranges["0"]) and ranges["2"].underflows
    assert out.isfinite().all().item()

    text = render.text(record)
    assert "numerics: closest to overflow: 1 (max " in text and "within 2^4 of overflow: 1" in text
    assert "underflow to zero: 2" in text
    html = dict(render.sections_html(record, None, hlo=False))["Numerics"]
    assert html.count('class="xlakit-bar"') == len(ranges) == 3
    assert '<tr class="near-overflow"><td>1</td>' in html and '<tr class="underflows"><td>2</td>' in html


def test_xla_step_nans_and_ranges_flags(shell):
    from test_notebook import run
    assert not xlakit.config.check_nans
    texts, htmls, result = run(shell, "%%xla_step --nans --ranges --name numerics\n"
                                      "v = torch.linspace(-1, 1, 4).to(dev)\nw = (v * 3).log()")
    assert isinstance(result.error_in_exec, FloatingPointError)
    assert "aten.log.default at cell" in str(result.error_in_exec)
    assert "numerics: first NaN made by aten.log.default" in texts[-1] and "Numerics</h4>" in htmls[-1]
    assert not xlakit.config.check_nans and not xlakit.config.record_ranges   # one cell only
    texts, _, result = run(shell, "%%xla_step --name numerics\nw = (v * 3).log()")
    assert result.error_in_exec is None and "numerics:" not in texts[-1]


@pytest.mark.parametrize("setting", ["check_nans", "record_ranges"])
def test_a_setting_the_cells_code_makes_outlives_the_cell(shell, setting):
    # only what the magic's own flags turned on is undone after the cell: a cell with no flags
    # that set check_nans (or record_ranges) found it False afterwards
    from test_notebook import run
    flag = {"check_nans": "--nans", "record_ranges": "--ranges"}[setting]
    cell = "\nv = torch.ones(2).to(dev) * 2"
    try:
        setattr(xlakit.config, setting, False)
        assert run(shell, f"%%xla_step --name settings\nxlakit.config.{setting} = True{cell}")[2].error_in_exec is None
        assert getattr(xlakit.config, setting) is True
        setattr(xlakit.config, setting, False)
        run(shell, f"%%xla_step --name settings {flag}{cell}")
        assert getattr(xlakit.config, setting) is False  # the flag's own setting: this cell only
        if setting == "check_nans":  # a value the flag does not set, set by the cell under the flag, stays
            run(shell, f"%%xla_step --name settings --nans\nxlakit.config.check_nans = 'warn'{cell}")
            assert xlakit.config.check_nans == "warn"
    finally:
        setattr(xlakit.config, setting, False)


def test_compiled_functions_find_the_first_nan_too(dev, nans):
    compiled = torch.compile(lambda x: (x.exp() - 2).log().sum(), backend="xlakit")
    torch.testing.assert_close(compiled(torch.ones(3)), (torch.ones(3).exp() - 2).log().sum())
    with pytest.raises(FloatingPointError, match=r"aten\.log\.default at test_numerics\.py:\d+ made the step's first NaN"):
        compiled(torch.zeros(3))   # its executable, run again
    assert xlakit.last_step().numerics.first_nonfinite.op == "aten.log.default"


def test_the_environment_turns_it_on(new_python):
    for value, expected in (("1", "True"), ("warn", "warn"), ("0", "False"), ("", "False")):
        done = new_python("-c", "import xlakit; print(xlakit.config.check_nans)",
                          env={**os.environ, "XLAKIT_CHECK_NANS": value})
        assert done.stdout.split()[-1] == expected, done.stderr[-2000:]


SHARDED = """
import torch, xlakit
dev = xlakit.device()
mesh = xlakit.Mesh((8,), ("data",))
xlakit.config.check_nans = True
x = torch.linspace(-1, 1, 64).reshape(8, 8).to(dev)
xlakit.mark_sharding(x, mesh, ("data", None))
xlakit.mark_step()
y = (x + 0.5).log() * 2
try:
    xlakit.mark_step()
except FloatingPointError as e:
    print(e)
print(len(xlakit.last_step().shardings.mesh.devices), xlakit.last_step().numerics.first_nonfinite.op)
"""


def test_a_sharded_step_finds_the_first_nan_too(new_python):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    done = new_python("-c", SHARDED, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "aten.log.default at " in done.stdout and "made the step's first NaN" in done.stdout
    assert done.stdout.splitlines()[-1] == "8 aten.log.default"
    assert "min -0.5 max 1.5" in done.stdout
