"""The Python API: `nmt.load(run).translate(...)` answers as `nmt translate` does."""

from __future__ import annotations

import doctest
import re
import shutil
import subprocess
import sys

import pytest

import nmt
from conftest import run_nmt
from nmt.errors import NmtError
from test_translate import _lines, _save_model, run_dir  # noqa: F401  (fixture)


@pytest.fixture(scope="module")
def model(run_dir):
    return nmt.load(run_dir, device="cpu", threads=1, max_len_b=8)


def test_the_docstring_example_runs(run_dir, tmp_path, monkeypatch):
    (tmp_path / "runs").mkdir()
    shutil.copytree(run_dir, tmp_path / "runs" / "multi30k-en-de")
    monkeypatch.chdir(tmp_path)
    result = doctest.testmod(nmt, verbose=False, report=True)
    assert result.attempted >= 6 and result.failed == 0


def test_translates_as_the_command_line_with_the_same_checkpoint_choice(run_dir, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    vocab = nmt.load(run, device="cpu").translator.src_tokenizer.vocab_size
    _save_model(run / "checkpoints" / "checkpoint_best.pt", vocab, seed=3)  # best beats last
    lines = _lines(5, 4) + [""]
    cli = run_nmt("translate", "--threads", "1", "-r", run, "--max-len-b", "8", "--beam", "3", "--quiet",
                  input="".join(l + "\n" for l in lines))
    assert cli.returncode == 0, cli.stderr
    model = nmt.load(run, device="cpu", threads=1, max_len_b=8)
    assert model.checkpoints == [run / "checkpoints" / "checkpoint_best.pt"]
    assert model.translate(lines, beam=3) == cli.stdout.splitlines()
    assert nmt.load(run, "checkpoint_last.pt", device="cpu").checkpoints == [run / "checkpoints" / "checkpoint_last.pt"]


def test_str_gives_str_list_gives_list_in_order_and_empty_gives_empty(model):
    lines = _lines(7, 5)
    together = model.translate(lines)
    assert isinstance(together, list) and len(together) == 7
    assert [model.translate(line) for line in lines] == together
    assert model.translate(tuple(lines)) == together
    assert model.translate([]) == []
    assert model.translate("") == ""
    assert model.translate(["", "  "]) == ["", ""]


def test_nbest_gives_scores_best_first(model):
    found = model.translate_nbest(_lines(3, 6), beam=3, nbest=3)
    assert len(found) == 3
    for tr in found:
        assert len(tr.nbest) == 3 and tr.nbest[0] == (tr.hyp, tr.score)
        assert [s for _, s in tr.nbest] == sorted((s for _, s in tr.nbest), reverse=True)
    assert model.translate_nbest("").score is None
    assert model.search.nbest == 1  # a per-call setting does not change the defaults


@pytest.mark.parametrize("bad, needle", [
    (42, "not int"), (b"bytes", "decode it first"), ({"a": 1}, "not dict"),
    (["ok", 3], "item 1 is a int"), (iter(["a"]), "not list_iterator"), (None, "not NoneType"),
])
def test_anything_but_str_or_list_of_str_is_a_type_error(model, bad, needle):
    with pytest.raises(TypeError, match=needle):
        model.translate(bad)


def test_unknown_settings_are_type_errors_and_bad_values_user_errors(run_dir, model):
    with pytest.raises(TypeError, match="beams"):
        model.translate("a", beams=2)
    with pytest.raises(TypeError, match="colour"):
        nmt.load(run_dir, colour="red")
    with pytest.raises(nmt.errors.NmtError, match="--beam must be at least 1"):
        model.translate("a", beam=0)


@pytest.mark.parametrize("setting, needle", [
    ({"beam": "4"}, "beam must be an int, not str '4'"), ({"beam": 4.0}, "beam must be an int, not float"),
    ({"nbest": True}, "nbest must be an int, not bool"), ({"lenpen": "0.6"}, "lenpen must be a number, not str"),
    ({"max_len_b": None}, "max_len_b must be an int, not NoneType"), ({"beam": [4]}, "beam must be an int, not list"),
    ({"beam_style": 1}, "beam_style must be a str, not int"),
])
def test_settings_of_the_wrong_type_are_user_errors_naming_the_setting(run_dir, model, setting, needle):
    with pytest.raises(nmt.errors.NmtError, match=re.escape(needle)):
        model.translate("a", **setting)
    with pytest.raises(nmt.errors.NmtError, match=re.escape(needle)):
        nmt.load(run_dir, device="cpu", **setting)


def test_numpy_numbers_are_settings_like_ints_and_floats(model):
    np = pytest.importorskip("numpy")
    assert model.translate("ein Hund", beam=np.int64(2), lenpen=np.float32(1.0)) == model.translate("ein Hund", beam=2, lenpen=1.0)
    assert model.translate("ein Hund", lenpen=1) == model.translate("ein Hund", lenpen=1.0)


def test_a_beam_above_the_limit_is_a_user_error(model):
    from nmt.inference import config as translate_config
    if not hasattr(translate_config, "MAX_BEAM"):
        pytest.skip("SearchConfig has no beam limit (nmt.inference.config.MAX_BEAM) yet")
    with pytest.raises(nmt.errors.NmtError, match="--beam"):
        model.translate("a", beam=10**6)


def test_import_nmt_does_not_import_torch():
    code = "import sys, nmt; assert callable(nmt.load); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_prefixes_constraints_and_alignments_per_call(model):
    lines = _lines(4, 7)
    found = model.translate_nbest(lines, prefix=["ein Mann", "", "zwei", ""], constraints=[[], ["Hunde"], [], ["Kinder", "Schnee"]],
                                  alignment="hard")
    assert found[0].hyp.startswith("ein Mann") and found[2].hyp.startswith("zwei")
    assert "Hunde" in found[1].hyp and "Kinder" in found[3].hyp and "Schnee" in found[3].hyp
    for line, tr in zip(lines, found):
        pairs = [tuple(map(int, p.split("-"))) for p in tr.alignment.split()]
        assert [j for _, j in pairs] == list(range(len(tr.hyp.split())))
        assert all(0 <= i < len(line.split()) for i, _ in pairs)
    assert model.translate(lines[0], prefix="ein Mann").startswith("ein Mann")
    assert "Hunde" in model.translate(lines[1], constraints=["Hunde"])
    soft = model.translate_nbest(lines[0], alignment="soft")
    assert len(soft.alignment) == len(soft.hyp.split()) and model.translate_nbest(lines[0]).alignment is None
    with pytest.raises(NmtError, match="3 prefix for 4 sentences"):
        model.translate(lines, prefix=["a", "b", "c"])
    with pytest.raises(NmtError, match="alignment must be one of hard, soft"):
        model.translate_nbest(lines, alignment="pharaoh")
    with pytest.raises(NmtError, match="prefix of one sentence is a str"):
        model.translate(lines[0], prefix=["a"])


@pytest.mark.parametrize("text, given, needle", [
    ("ein Hund", {"prefix": ["ein"]}, "prefix of one sentence is a str, not list"),
    ("ein Hund", {"constraints": "Hund"}, "constraints of one sentence is a list of str, not str"),
    ("ein Hund", {"constraints": ["Hund", 3]}, "constraints of one sentence is a list of str, but item 1 is a int"),
    (["ein Hund"], {"prefix": "ein"}, 'prefix of a list of sentences is a list of str, one per sentence ("" for none), not str'),
    (["ein Hund"], {"constraints": ["Hund"]}, "constraints of a list of sentences is a list of lists of str, one list per "
                                              "sentence, but item 0 is a str"),
    (["ein Hund"], {"constraints": [["Hund", None]]}, "constraints[0] is a list of str, but item 1 is a NoneType"),
])
def test_a_prefix_or_constraints_of_the_wrong_shape_is_one_user_error_that_names_the_shape(model, text, given, needle):
    with pytest.raises(NmtError, match=re.escape(needle)) as error:
        model.translate(text, **given)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("text, given, needle", [
    ("ein \ud800Hund", {}, "text holds a lone surrogate '\\ud800' at character 4"),
    (["ein Hund", "\udfff"], {}, "text[1] holds a lone surrogate"),
    ("ein Hund", {"prefix": "\ud800"}, "prefix holds a lone surrogate"),
    (["ein Hund"], {"prefix": ["ein\ud800"]}, "prefix[0] holds a lone surrogate"),
    ("ein Hund", {"constraints": ["Hund", "\ud800"]}, "constraints[1] holds a lone surrogate"),
    (["ein Hund"], {"constraints": [["\ud800"]]}, "constraints[0][0] holds a lone surrogate"),
])
def test_a_lone_surrogate_is_a_user_error_naming_where_it_is(model, text, given, needle):
    with pytest.raises(NmtError, match=re.escape(needle)):
        model.translate(text, **given)


def test_translators_of_per_call_settings_are_kept_for_a_few_settings_only(run_dir):
    from nmt.api import SETTINGS_CACHED

    model = nmt.load(run_dir, device="cpu", threads=1, max_len_b=4)
    first = model.with_search(beam=2)
    lenpens = [i / 10 for i in range(3 * SETTINGS_CACHED)]
    for lenpen in lenpens:
        model.translate("ein Hund", lenpen=lenpen)
    assert len(model._by_search) == SETTINGS_CACHED
    assert model.with_search(lenpen=lenpens[-1]) is model.with_search(lenpen=lenpens[-1])  # recent ones are kept
    assert model.with_search(beam=2) is not first  # the least recently used went
    assert len(model._by_search) == SETTINGS_CACHED
