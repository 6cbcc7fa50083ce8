"""The page at `/` of `nmt serve`, in headless Chromium: type a sentence, click, read the translation."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("uvicorn", reason="nmt serve needs the serve extra (make install installs it)")
pytest.importorskip("playwright", reason="the page test drives Chromium with playwright (make install installs it)")

import nmt  # noqa: E402
from serve_helpers import Server, find_or_install_chromium, translate_in_page  # noqa: E402
from test_translate import _lines, _make_run  # noqa: E402


@pytest.fixture(scope="module")
def chromium() -> str:
    path, why = find_or_install_chromium()
    if path is None:
        pytest.skip(f"no headless Chromium: {why}")
    return path


def test_typing_a_sentence_and_clicking_translate_shows_its_translation(chromium, tmp_path):
    run = _make_run(tmp_path / "run", _lines(400, 0), 90)
    sentence = "zwei Hunde spielen im Schnee"
    want = nmt.load(run, device="cpu", threads=1, max_len_b=6).translate(sentence)
    assert want  # something to see on the page
    srv = Server(run, "--threads", "1", "--max-len-b", "6", log_dir=tmp_path)
    try:
        shown = translate_in_page(srv.url + "/", sentence, chromium, screenshot=tmp_path / "page.png")
        assert shown["output"] == want
        assert shown["time"].endswith(" ms)") and "en → de" in shown["model"]
        assert (tmp_path / "page.png").stat().st_size > 1000
        assert srv.get("/info")["stats"]["requests"] == 1
    finally:
        assert srv.terminate() == 0, srv.output()
