"""The ``precision`` option of the built-in programs: the dots' matmul precision, set as a user sets
it (the step traced under jax.default_matmul_precision), recorded, and reachable from --variants."""

import re

import jax
import pytest

from xla_harness.cli import main
from xla_harness.errors import HarnessError
from xla_harness.programs import issue_35409, tied_embedding, variants
from xla_harness.programs.precision import PRECISIONS, check_precision
from xla_harness.stress.spec import StressSpec

SMALL = dict(scale=1 / 64, seq_scale=1 / 8, layers=(1, 2))
TINY = dict(vocab=64, d_model=32, layers=1, heads=2, seq=8, batch=8)
DOT = re.compile(r"stablehlo\.dot_general[^\n]*")
PRECISION_ATTR = re.compile(r",? precision = \[[A-Z_]+, [A-Z_]+\]")


def lowered_text(program) -> str:
    params, opt_state = jax.eval_shape(program.init, jax.random.key(0))
    batch = jax.eval_shape(lambda k: program.batch(k, 0), jax.random.key(0))
    return program.jit().lower(params, opt_state, batch).as_text()


def dot_precisions(text: str) -> list[str]:
    """The precision of every dot_general of a lowered module ("" where it carries none)."""
    out = []
    for dot in DOT.findall(text):
        m = re.search(r"precision = \[([A-Z_]+), ([A-Z_]+)\]", dot)
        out.append("" if m is None else f"{m.group(1)},{m.group(2)}")
    return out


@pytest.fixture(scope="module", params=["issue-35409", "tied-embedding"])
def lowered(request):
    """The lowered step of each program at each precision."""
    if request.param == "issue-35409":
        texts = {p: lowered_text(issue_35409.make(**SMALL, precision=p)) for p in PRECISIONS}
    else:
        texts = {p: lowered_text(tied_embedding.program(**TINY, precision=p)) for p in PRECISIONS}
    return request.param, texts


def test_precision_sets_every_dot_and_nothing_else(lowered):
    name, texts = lowered
    dots = {p: dot_precisions(t) for p, t in texts.items()}
    assert len(dots["default"]) > 10, name  # the forward and backward dots of the model
    assert len({len(d) for d in dots.values()}) == 1
    assert set(dots["default"]) <= {"", "DEFAULT,DEFAULT"}  # as jax writes a dot with no precision
    assert set(dots["high"]) == {"HIGH,HIGH"}
    assert set(dots["highest"]) == {"HIGHEST,HIGHEST"}
    # The math beyond precision is the same program: with the dots' precision taken out, the
    # lowered modules are equal text.
    stripped = {p: PRECISION_ATTR.sub("", t) for p, t in texts.items()}
    assert stripped["default"] == stripped["high"] == stripped["highest"]
    assert texts["default"] != texts["highest"]


def test_default_precision_is_the_program_as_it_was():
    """precision="default" compiles what the program compiled before the option existed: no context."""
    assert lowered_text(issue_35409.make(**SMALL)) == lowered_text(issue_35409.make(**SMALL, precision="default"))
    program = issue_35409.make(**SMALL, precision="default")
    assert program.step.__name__ == "step" and not hasattr(program.step, "__wrapped__")


def test_precision_is_recorded_in_options_and_name():
    assert issue_35409.make(**SMALL).options["precision"] == "default"
    assert issue_35409.make(**SMALL, precision="highest").options["precision"] == "highest"
    tied = tied_embedding.program(**TINY, precision="high")
    assert tied.options["precision"] == "high" and tied.name == "tied-embedding full/remat=on/f32/precision=high"
    assert tied_embedding.program(**TINY).name == "tied-embedding full/remat=on/f32"
    spec = StressSpec(program="issue-35409", program_options=(("precision", "highest"),))
    assert spec.labels() == ["issue-35409[precision=highest]"]


@pytest.mark.parametrize("bad", ["fast", "HIGHEST", "", None, 3, "float32"])
def test_bad_precision_is_one_sentence(bad):
    for build in (lambda: issue_35409.make(**SMALL, precision=bad),
                  lambda: tied_embedding.program(**TINY, precision=bad),
                  lambda: issue_35409.check_options(precision=bad)):
        # the built-ins' option table: one line naming the program, the option and what it takes
        with pytest.raises(HarnessError, match=r"^--program [a-z0-9-]+: option precision must be one of default, "
                                               r"high, highest, got "):
            build()
    with pytest.raises(HarnessError):
        check_precision(bad)


def test_bad_precision_on_the_command_line_exits_2(tmp_path, capsys):
    rc = main(["stress", "--program", "issue-35409", "--program-option", "precision=fast", "--compile-only",
               "--program-option", "scale=0.015625", "--out", str(tmp_path / "o")])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    says = "option precision must be one of default, high, highest, got 'fast'"
    assert rc == 2 and len(err) == 1 and err[0].startswith("error:") and says in err[0], err
    assert not (tmp_path / "o" / "compile.jsonl").exists()
    rc = main(["stress", "--variants", "baseline,precision-fast", "--steps", "1", "--out", str(tmp_path / "v")])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(err) == 1 and "unknown variant 'precision-fast'" in err[0], err


@pytest.mark.parametrize("name, parts", [
    ("precision-highest", ("baseline", "highest", "")),
    ("precision-high", ("baseline", "high", "")),
    ("barrier+precision-highest", ("barrier", "highest", "")),
    ("precision-high+tpu-no-fusion", ("baseline", "high", "tpu-no-fusion")),
    ("onehot+precision-highest+xla-no-fusion", ("onehot", "highest", "xla-no-fusion")),
    ("barrier+xla-no-fusion", ("barrier", "default", "xla-no-fusion")),
    ("xla-no-fusion", ("baseline", "default", "xla-no-fusion")),
])
def test_variant_names_carry_the_precision(name, parts):
    assert variants.parse_variant(name) == parts


@pytest.mark.parametrize("name", ["precision-highest+barrier", "xla-no-fusion+precision-high",
                                  "precision-high+precision-highest", "barrier+onehot", "precision-low"])
def test_variant_parts_out_of_order_or_unknown_are_refused(name):
    with pytest.raises(HarnessError, match=name.replace("+", r"\+")):
        variants.parse_variant(name)


def test_precision_variants_build_the_program_at_that_precision():
    program = variants.variant_program(issue_35409.make, "barrier+precision-highest", **SMALL)
    assert program.options["precision"] == "highest" and program.options["variant"] == "barrier"
    assert set(dot_precisions(lowered_text(program))) == {"HIGHEST,HIGHEST"}
    tied = variants.variant_program(tied_embedding.program, "precision-high", **TINY)
    assert tied.options["precision"] == "high"
    with pytest.raises(HarnessError, match="sets the precision, and so does the option"):
        variants.variant_program(issue_35409.make, "precision-high", precision="highest", **SMALL)

    def no_precision(scale=1.0, variant="baseline"):
        return issue_35409.make(**SMALL, variant=variant)

    with pytest.raises(HarnessError, match="does not take precision="):
        variants.variant_program(no_precision, "precision-high")


def test_stress_spec_labels_precision_variants_and_refuses_two_precisions():
    spec = StressSpec(modes=("full",), remats=(True,), seeds=(1,), steps=1,
                      variants=("baseline", "precision-highest"), **TINY)
    assert spec.labels() == ["full/remat=on/f32[variant=baseline]", "full/remat=on/f32[variant=precision-highest]"]
    with pytest.raises(HarnessError, match="precision=... and a precision-... variant exclude each other"):
        StressSpec(program="issue-35409", program_options=(("precision", "high"),),
                   variants=("baseline", "precision-highest"))
