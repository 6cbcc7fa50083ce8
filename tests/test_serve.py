"""`nmt serve`: a real server in a subprocess, on a free loopback port, with a tiny run."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time

import pytest

pytest.importorskip("starlette", reason="nmt serve needs the serve extra (make install installs it)")
pytest.importorskip("uvicorn", reason="nmt serve needs the serve extra (make install installs it)")

import nmt  # noqa: E402
from conftest import assert_one_line_error, run_nmt, torch_blocked_env  # noqa: E402
from nmt.serve.app import ClientError, parse_body  # noqa: E402
from nmt.inference.config import CTRANSLATE2_CPU_BATCH_TOKENS  # noqa: E402
from nmt.serve.config import ServeConfig  # noqa: E402
from serve_helpers import Server  # noqa: E402
from test_translate import _lines, run_dir  # noqa: E402, F401  (fixture)

FLAGS = ("--threads", "1", "--max-len-b", "6", "--max-chars", "2000", "--max-lines", "40", "--batch-window-ms", "100")


@pytest.fixture(scope="module")
def model(run_dir):
    return nmt.load(run_dir, device="cpu", threads=1, max_len_b=6)


@pytest.fixture(scope="module")
def server(run_dir, tmp_path_factory):
    srv = Server(run_dir, *FLAGS, log_dir=tmp_path_factory.mktemp("log"))
    yield srv
    code = srv.terminate()
    assert code == 0, srv.output()
    assert "Traceback" not in srv.output()
    # no third-party warning a user would read as misconfiguration (torch's extension builder's CUDA_HOME one)
    assert "Warning" not in srv.output() and "cpp_extension" not in srv.output(), srv.output()


def test_a_single_string_and_a_list_with_empty_strings_keep_count_and_order(server, model, run_dir):
    status, answer = server.post({"text": "ein Mann fährt Fahrrad"})
    assert status == 200, answer
    assert [t["text"] for t in answer["translations"]] == [model.translate("ein Mann fährt Fahrrad")]

    lines = _lines(5, 11)
    lines[1:1] = ["", "   "]
    lines.append("")
    status, answer = server.post({"text": lines})
    assert status == 200, answer
    found = answer["translations"]
    assert [t["text"] for t in found] == model.translate(lines)
    assert found[1] == {"text": "", "score": None, "nbest": []} and found[-1]["text"] == ""
    assert all(isinstance(t["score"], float) for i, t in enumerate(found) if lines[i].strip())

    # Provenance: the checkpoint by path and hash, and the settings used.
    ckpt = run_dir / "checkpoints" / "checkpoint_last.pt"
    assert answer["checkpoints"] == [{"path": str(ckpt), "sha256": hashlib.sha256(ckpt.read_bytes()).hexdigest()}]
    assert answer["settings"]["beam"] == 4 and answer["settings"]["max_len_b"] == 6
    assert answer["settings"]["device"] == "cpu"
    assert server.post({"text": []}) == (200, {**answer, "translations": [], "time_ms": pytest.approx(0, abs=1e9)})


def test_beam_lenpen_and_nbest_per_request(server, model):
    lines = _lines(3, 12)
    status, answer = server.post({"text": lines, "beam": 3, "nbest": 3, "lenpen": 1.0})
    assert status == 200, answer
    want = model.translate_nbest(lines, beam=3, nbest=3, lenpen=1.0)
    for t, w in zip(answer["translations"], want):
        assert [n["text"] for n in t["nbest"]] == [h for h, _ in w.nbest]
        assert [n["score"] for n in t["nbest"]] == pytest.approx([s for _, s in w.nbest], abs=1e-4)
    assert answer["settings"]["beam"] == 3 and answer["settings"]["lenpen"] == 1.0


def test_prefix_constraints_and_alignment_per_request(server, model):
    lines = _lines(3, 14)
    body = {"text": lines, "prefix": ["ein", "", ""], "constraints": [[], ["Hunde"], []], "alignment": "hard"}
    status, answer = server.post(body)
    assert status == 200, answer
    want = model.translate_nbest(lines, prefix=body["prefix"], constraints=body["constraints"], alignment="hard")
    assert [(t["text"], t["alignment"]) for t in answer["translations"]] == [(w.hyp, w.alignment) for w in want]
    assert answer["translations"][0]["text"].startswith("ein") and "Hunde" in answer["translations"][1]["text"]
    status, answer = server.post({"text": lines[0], "prefix": "zwei", "constraints": ["Kinder"], "alignment": "soft"})
    assert status == 200, answer
    found = answer["translations"][0]
    assert found["text"].startswith("zwei") and "Kinder" in found["text"] and len(found["alignment"]) == len(found["text"].split())
    for bad, needle in (({"text": lines, "prefix": "ein"}, '"prefix" must be a list of 3 strings'),
                        ({"text": "a", "constraints": "Hunde"}, '"constraints" must be a list of strings'),
                        ({"text": "a", "alignment": True}, '"alignment" must be "hard" or "soft"'),
                        ({"text": "ein Mann", "prefix": "ein " * 30}, "text 1: its prefix takes")):
        status, answer = server.post(bad)
        assert status == 400 and needle in answer["error"], answer


def test_twenty_concurrent_clients_get_their_own_answers_in_fewer_model_calls(server, model):
    requests = [_lines(1 + i % 3, 100 + i) for i in range(20)]
    want = [model.translate(lines) for lines in requests]
    before = server.get("/info")["stats"]
    answers: list = [None] * 20
    start = threading.Barrier(20)

    def client(i: int) -> None:
        start.wait()
        answers[i] = server.post({"text": requests[i]})

    threads = [threading.Thread(target=client, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    for i, (status, answer) in enumerate(answers):
        assert status == 200, answer
        assert [t["text"] for t in answer["translations"]] == want[i]
    assert len({json.dumps(w) for w in want}) > 10  # the answers differ, so a mix-up would show
    after = server.get("/info")["stats"]
    assert after["requests"] - before["requests"] == 20
    assert after["sentences"] - before["sentences"] == sum(map(len, requests))
    assert 1 <= after["batches"] - before["batches"] < 20  # requests shared model calls
    assert after["largest_batch"] > 1


@pytest.mark.parametrize("body, status, needle", [
    (b'{"text": "a', 400, "not valid JSON"),
    (b'{"text": "caf\xe9"}', 400, "not valid UTF-8"),
    (b'["a"]', 400, "JSON object"),
    (b'{"txt": "a"}', 400, "unknown field"),
    (b'{"beam": 2}', 400, 'missing field "text"'),
    (b'{"text": 5}', 400, "string or a list of strings"),
    (b'{"text": ["a", null]}', 400, "string or a list of strings"),
    (b'{"text": "a", "beam": "4"}', 400, '"beam" must be an integer'),
    (b'{"text": "a", "beam": 0}', 400, '"beam" must be between 1 and 16'),
    (b'{"text": "a", "beam": 2, "nbest": 3}', 400, "nbest must be between 1 and beam (2)"),
    (b'{"text": "a", "lenpen": true}', 400, '"lenpen" must be a number, not boolean'),
    (b'{"text": "a", "lenpen": "0.6"}', 400, '"lenpen" must be a number, not string'),
    (b'{"text": "a", "lenpen": 1e308}', 400, '"lenpen" must be at most 10, not 1e+308'),
    (b'{"text": "a", "lenpen": NaN}', 400, '"lenpen" must be a finite number in [0, 10], not nan'),
    (b'{"text": "a", "lenpen": -Infinity}', 400, "not -inf"),
    (b'{"text": "a", "lenpen": 1' + b"0" * 400 + b'}', 400, '"lenpen" must be at most 10, not 100000000000000000000...'),
    (b'{"text": "a", "lenpen": -0.5}', 400, '"lenpen" must be at least 0, not -0.5'),
    (b'{"text": "a", "beam": 1000000}', 400, '"beam" must be between 1 and 16, not 1000000'),
    (b'{"text": "a", "beam": 4.0}', 400, '"beam" must be an integer, not number'),
    (b'{"text": "a", "nbest": "1"}', 400, '"nbest" must be an integer, not string'),
    (b'{"text": {"a": "b"}}', 400, '"text" must be a string or a list of strings, not object'),
    (b'{"text": "ok \\ud800"}', 400, '"text" holds a lone surrogate'),
    (b'{"text": ["ok", "\\udfff"]}', 400, '"text" (item 1) holds a lone surrogate'),
    (b'{"text": "a", "prefix": "\\ud800"}', 400, '"prefix" holds a lone surrogate'),
    (b'{"text": ["a", "b"], "prefix": ["", "ok \\udbff"]}', 400, '"prefix" (item 1) holds a lone surrogate'),
    (b'{"text": "a", "constraints": ["ok", "\\udc00"]}', 400, '"constraints" (phrase 1) holds a lone surrogate'),
    (b'{"text": ["a"], "constraints": [["\\ud800"]]}', 400, '"constraints" (item 0, phrase 0) holds a lone surrogate'),
    (b"[" * 40000 + b"]" * 40000, 400, "nested too deeply"),
    (b'{"text": "a", "beam": ' + b"1" * 5000 + b"}", 400, "a number with thousands of digits"),
    (json.dumps({"text": "x" * 2001}).encode(), 413, "2001 characters"),
    (json.dumps({"text": "x" * 1000, "prefix": "y" * 600, "constraints": ["z" * 200, "z" * 201]}).encode(), 413,
     "2001 characters (texts, prefixes and constraints) is more than this server takes at once (--max-chars 2000)"),
    (json.dumps({"text": ["a", "b"], "constraints": [[], ["z" * 201]]}).encode(), 400,
     '"constraints" (item 1) has 201 characters, more than this server takes per sentence (--max-phrase-chars 200)'),
    (json.dumps({"text": ["a"] * 41}).encode(), 413, "41 sentences"),
    (b'{"text": "' + b"a" * (12 * 2000 + 70000) + b'"}', 413, "larger than"),
])
def test_bad_bodies_get_a_4xx_with_a_one_line_json_reason(server, body, status, needle):
    got, headers, raw = server.request("POST", "/translate", body, {"Content-Type": "application/json"})
    assert got == status, raw
    assert headers["content-type"] == "application/json"
    error = json.loads(raw)["error"]
    assert needle in error and "\n" not in error and "Traceback" not in error


def test_a_sentence_with_more_constraint_phrases_than_max_phrases_gets_a_400_naming_the_flag(server):
    """62 one-word phrases at beam 16 held the model 3 times as long as none: refused before the model."""
    before = server.get("/info")["stats"]
    text = " ".join(_lines(12, 3))  # some 80 words, 1000 characters with 62 of them as phrases
    status, answer = server.post({"text": text, "beam": 16, "constraints": [w for w in text.split()[:62]]})
    assert status == 400, answer
    assert answer["error"] == '"constraints" has 62 phrases, more than this server takes per sentence (--max-phrases 8)'
    assert server.get("/info")["stats"]["requests"] == before["requests"]
    status, answer = server.post({"text": [text, "ein Mann"], "constraints": [["Hunde"] * 8, ["Hunde"] * 9]})
    assert status == 400 and "(item 1) has 9 phrases" in answer["error"], answer


def test_a_too_large_body_gets_its_413_even_when_the_connection_closes_after_it(server):
    """The client sends all 20 MB before it reads; the server reads them (and drops them) so
    that closing the connection does not reset it before the client has read the 413."""
    body = b'{"text": "' + b"a" * 20_000_000 + b'"}'
    for headers in ({}, {"Connection": "close"}):
        got, _, raw = server.request("POST", "/translate", body, {"Content-Type": "application/json", **headers})
        assert got == 413 and "larger than" in json.loads(raw)["error"]


def test_unknown_paths_and_methods_get_json_errors(server):
    for method, path, status in (("GET", "/nope", 404), ("GET", "/translate", 405), ("POST", "/health", 405)):
        got, headers, raw = server.request(method, path)
        assert got == status and headers["content-type"] == "application/json" and "error" in json.loads(raw)


def test_health_info_and_page(server, model):
    assert server.get("/health") == {"status": "ok"}
    info = server.get("/info")
    assert (info["source_lang"], info["target_lang"]) == ("en", "de")
    assert info["parameters"] == sum(p.numel() for p in model.translator.models[0].parameters())
    assert info["model"]["d_model"] == model.translator.models[0].cfg.d_model
    assert info["checkpoints"][0]["path"].endswith("checkpoint_last.pt") and len(info["checkpoints"][0]["sha256"]) == 64
    assert info["limits"]["max_lines"] == 40
    assert {k: info["limits"][k] for k in ("max_phrases", "max_phrase_chars", "shutdown_grace_s")} == \
        {"max_phrases": 8, "max_phrase_chars": 200, "shutdown_grace_s": 30.0}
    status, headers, page = server.request("GET", "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert b'id="translate"' in page and b"://" not in page  # no CDN, no outside URL


def test_sigterm_answers_the_requests_in_flight_then_exits_0(run_dir, model, tmp_path):
    """Within --shutdown-grace-s (30 s) the requests started are translated; those that have not
    started when SIGTERM comes get a 503 at once."""
    srv = Server(run_dir, "--threads", "1", "--max-len-b", "20", "--max-batch-sentences", "2", log_dir=tmp_path)
    try:
        requests = [_lines(12, 200 + i) for i in range(4)]
        answers: list = [None] * 4
        threads = [threading.Thread(target=lambda i=i: answers.__setitem__(i, srv.post({"text": requests[i]})))
                   for i in range(4)]
        threads[0].start()  # the first is started before the others arrive, so it is the oldest
        srv.wait_for_stats(lambda s: s["requests"] == 1 and s["batches"] >= 1)
        for t in threads[1:]:
            t.start()
        # All four are with the batcher, and the oldest is started: every call takes one of its sentences.
        stats = srv.wait_for_stats(lambda s: s["requests"] == 4)
        assert stats["batches"] < 24  # and not all of their 24 model calls are done
        code = srv.terminate()
        for t in threads:
            t.join(timeout=300)
        assert code == 0, srv.output()
        assert answers[0][0] == 200, answers[0]
        for lines, (status, answer) in zip(requests, answers):
            assert status in (200, 503), answer
            if status == 200:
                assert [t["text"] for t in answer["translations"]] == model.translate(lines, max_len_b=20)
            else:
                assert answer == {"error": "the server is shutting down; send the request again"}
        assert "Traceback" not in srv.output()
    finally:
        srv.stop()


def test_a_port_in_use_is_a_one_line_error(run_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert_one_line_error(run_nmt("serve", "-r", run_dir, "--port", port, timeout=900), "cannot listen", str(port))


def test_the_ctranslate2_engine_serves_translations_and_info(run_dir, tmp_path):
    pytest.importorskip("ctranslate2")
    search = {"beam_style": "fairseq", "lenpen_style": "avg", "max_len_b": 6}
    model = nmt.load(run_dir, device="cpu", threads=1, engine="ctranslate2", **search)  # exports RUN/ctranslate2 first
    srv = Server(run_dir, "--threads", "1", "--engine", "ctranslate2", "--beam-style", "fairseq", "--lenpen-style", "avg",
                 "--max-len-b", "6", log_dir=tmp_path, env=torch_blocked_env(tmp_path))  # serves without torch
    try:
        lines = _lines(4, 31) + [""]
        status, answer = srv.post({"text": lines, "beam": 3, "nbest": 2})
        assert status == 200, answer
        assert [t["text"] for t in answer["translations"]] == model.translate(lines, beam=3)
        assert answer["settings"]["engine"] == "ctranslate2" and answer["settings"]["beam"] == 3
        assert answer["settings"]["inter_threads"] == 1  # a server's call is one batch: every thread works on it
        info = srv.get("/info")
        assert info["settings"]["device"] == "cpu" and info["settings"]["dtype"] == "float32"
        assert answer["settings"]["max_tokens"] == CTRANSLATE2_CPU_BATCH_TOKENS  # --max-tokens 0 (auto), resolved
        torch_model = nmt.load(run_dir, device="cpu").translator.models[0]  # the checkpoint CTranslate2 runs
        assert info["model"] == torch_model.cfg.to_dict()
        assert info["parameters"] == sum(p.numel() for p in torch_model.parameters())
        assert srv.terminate() == 0
        assert "Traceback" not in srv.output()
    finally:
        srv.stop()


def test_a_default_beam_no_request_may_ask_for_is_a_one_line_error(run_dir):
    assert_one_line_error(run_nmt("serve", "-r", run_dir, "--port", "0", "--beam", "20", timeout=900), "--beam 20", "--max-beam 16")


def test_parse_body_refuses_100k_deep_json_with_a_400():
    with pytest.raises(ClientError) as e:
        parse_body(b"[" * 100_000 + b"]" * 100_000, ServeConfig())
    assert e.value.status == 400 and "nested too deeply" in e.value.reason


def test_parse_body_refuses_more_phrases_than_max_phrases_and_counts_them_in_max_chars():
    cfg = ServeConfig(max_chars=10, max_phrases=2)
    assert parse_body('{"text": "ab", "prefix": "c", "constraints": ["d", "e"]}'.encode(), cfg)[0] == [("ab", "c", ["d", "e"])]
    with pytest.raises(ClientError) as e:
        parse_body(b'{"text": "ab", "constraints": ["d", "e", "f"]}', cfg)
    assert e.value.status == 400 and "--max-phrases 2" in e.value.reason
    with pytest.raises(ClientError) as e:
        parse_body(b'{"text": "abc", "prefix": "defg", "constraints": ["hijk"]}', cfg)
    assert e.value.status == 413 and e.value.reason.startswith("11 characters") and "--max-chars 10" in e.value.reason


def test_parse_body_limits_count_characters_not_bytes():
    cfg = ServeConfig(max_chars=4, max_lines=2)
    assert parse_body('{"text": ["äöü", "ß"]}'.encode(), cfg) == ([("äöü", "", []), ("ß", "", [])], False, {})
    assert parse_body(b'{"text": "\\u00e4", "beam": 2}', cfg) == ([("ä", "", [])], True, {"beam": 2})
