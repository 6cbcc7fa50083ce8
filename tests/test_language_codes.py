"""A language code names files (PREFIX.LANG, vocab/LANG.model, an export's LANG_source.spm):
preprocess, import and export apply one rule to it, so no code writes outside its folder.
Import's and export's use of it are tested in test_import_marian.py."""

from __future__ import annotations

import pytest

from conftest import assert_one_line_error, run_nmt
from nmt.errors import NmtError
from nmt.preprocess.config import PreprocessConfig, check_language_code


@pytest.mark.parametrize("code", ["en", "pt_BR", "zh-Hans", "ger2", "ελ"])
def test_letters_digits_dashes_and_underscores_make_a_code(code):
    assert check_language_code("-s", code) == code


@pytest.mark.parametrize("code", ["../x", "a/b", "..", ".", "en.", "", "e n", "e\0n", 7, None, ["en"]])
def test_anything_else_is_refused_naming_where_it_came_from(code):
    with pytest.raises(NmtError, match=r"^tokenizer_config\.json's source_lang .* may only hold letters, digits, '-' and '_'$"):
        check_language_code("tokenizer_config.json's source_lang", code)


@pytest.mark.parametrize("field, flag", [("source_lang", "--source-lang/-s"), ("target_lang", "--target-lang/-t")])
def test_preprocess_refuses_a_code_that_names_another_folder(field, flag):
    cfg = PreprocessConfig(**{"source_lang": "en", "target_lang": "de", field: "../x"}, trainpref="train")
    with pytest.raises(NmtError, match=f"^{flag} '../x' may only hold"):
        cfg.validate()


def test_preprocess_command_refuses_it_in_one_line_writing_nothing(tmp_path):
    proc = run_nmt("preprocess", "-r", tmp_path / "run", "-s", "../x", "-t", "de", "--trainpref", tmp_path / "train")
    assert_one_line_error(proc, "--source-lang/-s '../x'", "letters, digits")
    assert list(tmp_path.iterdir()) == []
