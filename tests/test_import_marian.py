"""`nmt import --from hf-marian` against transformers itself: a small random MarianMTModel
(its config, no download) with SentencePiece models trained on Multi30k lines, saved with
`save_pretrained`, imported, and compared with transformers' own forward pass, greedy
search and tokenizer, and with CTranslate2 on `nmt export` of the import."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
import torch

from conftest import assert_one_line_error, run_nmt, start_nmt

transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")

N_TOKENIZER_LINES = 1000
N_GREEDY_LINES = 200


def _lines(path: Path, n: int) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for _, line in zip(range(n), f)]


def _train_spm(lines: list[str], prefix: Path, size: int) -> Path:
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=str(prefix), vocab_size=size,
                                   model_type="unigram", character_coverage=1.0, minloglevel=2)
    return prefix.with_suffix(".model")


@pytest.fixture(scope="module")
def marian_files(tmp_path_factory, multi30k_dir):
    """source.spm, target.spm and a vocab.json as OPUS-MT lays them out: </s> 0, <unk> 1,
    the pieces of both models, <pad> last."""
    d = tmp_path_factory.mktemp("marian_tok")
    en, de = _lines(multi30k_dir / "train.en.gz", 3000), _lines(multi30k_dir / "train.de.gz", 3000)
    src, tgt = _train_spm(en, d / "src", 600), _train_spm(de, d / "tgt", 600)
    pieces: dict[str, int] = {"</s>": 0, "<unk>": 1}
    for model in (src, tgt):
        sp = spm.SentencePieceProcessor(model_file=str(model))
        for i in range(sp.get_piece_size()):
            piece = sp.id_to_piece(i)
            if not sp.is_control(i) and not sp.is_unknown(i) and piece not in pieces:
                pieces[piece] = len(pieces)
    pieces["<pad>"] = len(pieces)
    (d / "vocab.json").write_text(json.dumps(pieces, ensure_ascii=False), encoding="utf-8")
    tok = transformers.MarianTokenizer(source_spm=str(src), target_spm=str(tgt), vocab=str(d / "vocab.json"),
                                       source_lang="en", target_lang="de")
    return tok, len(pieces)


VARIANTS = {
    # OPUS-MT's settings: swish, one shared matrix for everything, a logits bias.
    "opus": dict(activation_function="swish", share_encoder_decoder_embeddings=True, tie_word_embeddings=True, safe=True),
    # The fields are read, not assumed: relu, untied embeddings and output layer, pytorch_model.bin.
    "relu-untied": dict(activation_function="relu", share_encoder_decoder_embeddings=True, tie_word_embeddings=False, safe=False),
}


def _save_model(folder: Path, tok, vocab_size: int, variant: str, seed: int = 0):
    opts = dict(VARIANTS[variant])
    safe = opts.pop("safe")
    pad = vocab_size - 1
    config = transformers.MarianConfig(
        vocab_size=vocab_size, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=256,
        pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=0, scale_embedding=True,
        dropout=0.1, init_std=0.15, **opts)
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(config).eval()
    with torch.no_grad():  # a bias that is not zero, so that the import must carry it; eos likelier, so that
        model.final_logits_bias.normal_(0.0, 0.5)  # most lines end before the length limit (greedy: not all)
        model.final_logits_bias[0, 0] = 7.0
    model.save_pretrained(folder)
    if not safe:  # transformers 5 writes safetensors only; OPUS-MT folders on the Hub also have this older file
        from safetensors.torch import load_file

        torch.save(load_file(str(folder / "model.safetensors")), folder / "pytorch_model.bin")
        (folder / "model.safetensors").unlink()
    tok.save_pretrained(folder)
    return model


@pytest.fixture(scope="module", params=list(VARIANTS))
def imported(request, tmp_path_factory, marian_files):
    """(transformers model, its tokenizer, the imported run directory) per variant."""
    tok, vocab_size = marian_files
    d = tmp_path_factory.mktemp(f"marian_{request.param}")
    model = _save_model(d / "hf", tok, vocab_size, request.param)
    proc = run_nmt("import", "-r", d / "run", "--from", "hf-marian", d / "hf")
    assert proc.returncode == 0, proc.stderr
    return model, tok, d / "run", request.param


def _nmt_model(run: Path):
    from nmt.model.config import TransformerConfig
    from nmt.model.transformer import Transformer
    from nmt.run.checkpoint import load_checkpoint

    ckpt = load_checkpoint(run / "checkpoints" / "checkpoint_last.pt")
    model = Transformer(TransformerConfig.from_dict(ckpt["config"]))
    model.load_state_dict(ckpt["model"])
    return model.eval()


def test_teacher_forced_log_probs_match_transformers(imported, multi30k_dir):
    hf, tok, run, variant = imported
    nmt = _nmt_model(run)
    cfg = nmt.cfg
    assert (cfg.activation, cfg.positions_layout, cfg.output_bias) == (VARIANTS[variant]["activation_function"], "halves", True)
    assert cfg.share_decoder_input_output_embed == VARIANTS[variant]["tie_word_embeddings"]
    en, de = _lines(multi30k_dir / "val.en.gz", 50), _lines(multi30k_dir / "val.de.gz", 50)
    batch = tok(en, text_target=de, return_tensors="pt", padding=True)
    labels = batch["labels"]  # pieces + </s>, padded with <pad>
    prev = torch.cat([torch.full((len(de), 1), cfg.bos_id), labels[:, :-1]], 1)
    with torch.no_grad():
        ours = torch.log_softmax(nmt(batch["input_ids"], prev), -1)
        theirs = torch.log_softmax(hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                      decoder_input_ids=prev).logits, -1)
    real = labels.ne(cfg.pad_id)
    assert int(real.sum()) > 500
    assert (ours[real] - theirs[real]).abs().max().item() < 1e-5


def _greedy_transformers(hf, tok, lines: list[str]) -> list[list[int]]:
    """transformers' greedy search, each line limited as nmt limits it: |X| + 50 tokens, then eos."""
    enc = [tok(line)["input_ids"] for line in lines]
    out: list[list[int]] = [[] for _ in lines]
    by_len: dict[int, list[int]] = {}
    for i, ids in enumerate(enc):
        by_len.setdefault(len(ids), []).append(i)
    pad = hf.config.pad_token_id
    for n, rows in by_len.items():
        src = torch.tensor([enc[i] for i in rows])
        with torch.no_grad():
            gen = hf.generate(input_ids=src, attention_mask=torch.ones_like(src), num_beams=1, do_sample=False,
                              max_new_tokens=(n - 1) + 51, bad_words_ids=[[pad]], min_length=0)
        for i, seq in zip(rows, gen.tolist()):
            seq = seq[1:]  # the decoder start
            out[i] = seq[: seq.index(0)] if 0 in seq else seq
    return out


def test_greedy_outputs_match_transformers(imported, multi30k_dir):
    from nmt.data.tokenizer import load_tokenizer
    from nmt.inference.beam_search import beam_search
    from nmt.inference.config import SearchConfig
    from nmt.data.batching import source_tensor

    hf, tok, run, _ = imported
    nmt = _nmt_model(run)
    lines = _lines(multi30k_dir / "test_2016_flickr.en.gz", N_GREEDY_LINES)
    ids = load_tokenizer(run / "vocab" / "source.spm").encode(lines)
    search = SearchConfig(beam=1, beam_style="fairseq")  # greedy: eos ends a line only as its best token (t2t's beam 1 looks at 2)
    ours = []
    for start in range(0, len(ids), 50):
        chunk = ids[start : start + 50]
        ours += [found[0].tokens for found in beam_search(nmt, source_tensor(chunk, nmt.cfg.special_ids), search)]
    theirs = _greedy_transformers(hf, tok, lines)
    at_limit = sum(len(o) == len(s) + 50 for o, s in zip(ours, ids))
    print(f"greedy: {at_limit}/{len(lines)} lines at the length limit")
    assert 0 < at_limit < len(lines), "both kinds of ending are compared"
    assert sum(o == t for o, t in zip(ours, theirs)) == len(lines)


def test_ctranslate2_beam_agrees_with_nmt(imported, multi30k_dir, tmp_path):
    """At the length limit CTranslate2 ends a hypothesis with any token where nmt forces eos
    (nmt.inference.ctranslate2_engine); the model's eos bias keeps beam search off the limit."""
    pytest.importorskip("ctranslate2")
    _, _, run, _ = imported
    src = tmp_path / "test.en"
    src.write_text("\n".join(_lines(multi30k_dir / "test_2016_flickr.en.gz", N_GREEDY_LINES)) + "\n", encoding="utf-8")
    proc = run_nmt("export", "-r", run, "-o", tmp_path / "ct2")
    assert proc.returncode == 0, proc.stderr
    style = ["--beam-style", "fairseq", "--lenpen-style", "avg", "--input", src]
    native = run_nmt("translate", "-r", run, *style)
    ct2 = run_nmt("translate", "-r", run, *style, "--engine", "ctranslate2", "--ct2-model", tmp_path / "ct2")
    assert native.returncode == 0 and ct2.returncode == 0, native.stderr + ct2.stderr
    a, b = native.stdout.splitlines(), ct2.stdout.splitlines()
    assert len(a) == len(b) == N_GREEDY_LINES
    same = sum(x == y for x, y in zip(a, b))
    print(f"nmt and CTranslate2 agree on {same}/{N_GREEDY_LINES} lines")
    assert same >= 0.99 * N_GREEDY_LINES, f"only {same}/{N_GREEDY_LINES} lines agree"


def test_api_and_server_translate_the_imported_run_as_the_command_does(imported, multi30k_dir, tmp_path):
    import nmt
    from serve_helpers import Server

    _, _, run, variant = imported
    if variant != "opus":
        pytest.skip("one variant is enough")
    lines = _lines(multi30k_dir / "test_2016_flickr.en.gz", 20)
    lines[3] = ""
    src = tmp_path / "test.en"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    command = run_nmt("translate", "-r", run, "--input", src)
    assert command.returncode == 0, command.stderr
    expected = command.stdout.split("\n")[: len(lines)]
    assert nmt.load(run).translate(lines) == expected
    server = Server(run, "--threads", "1")
    try:
        status, answer = server.post({"text": lines})
        assert status == 200, answer
        assert [t["text"] for t in answer["translations"]] == expected
        info = server.get("/info")
        assert (info["source_lang"], info["target_lang"], info["imported"]["from"]) == ("en", "de", "hf-marian")
    finally:
        server.stop()


def test_tokenizer_ids_match_marian_tokenizer(marian_files, tmp_path, multi30k_dir):
    from nmt.data.tokenizer import MarianTokenizer

    tok, _ = marian_files
    tok.save_pretrained(tmp_path)
    en = _lines(multi30k_dir / "train.en.gz", 30000)[-N_TOKENIZER_LINES:]  # lines the models were not trained on
    de = _lines(multi30k_dir / "train.de.gz", 30000)[-N_TOKENIZER_LINES:]
    ours_src, ours_tgt = MarianTokenizer(tmp_path / "source.spm"), MarianTokenizer(tmp_path / "target.spm")
    eos = ours_src.special_ids.eos
    assert [ids + [eos] for ids in ours_src.encode(en)] == tok(en)["input_ids"]
    tgt_ids = ours_tgt.encode(de)
    assert [ids + [eos] for ids in tgt_ids] == tok(text_target=de)["input_ids"]
    known = [i for i, ids in enumerate(tgt_ids) if ours_tgt.special_ids.unk not in ids]
    assert len(known) > 900
    decoded = ours_tgt.decode([tgt_ids[i] for i in known])
    assert decoded == tok.batch_decode([tgt_ids[i] for i in known], skip_special_tokens=True)


def test_finetune_and_resume(imported, multi30k_dir, tmp_path):
    """The imported model fine-tunes on a corpus preprocessed with its vocabulary, resumes, and translates."""
    _, _, run, variant = imported
    if variant != "opus":
        pytest.skip("one variant is enough")
    for split, n in (("train", 400), ("val", 50)):
        for lang in ("en", "de"):
            (tmp_path / f"{split}.{lang}").write_text("\n".join(_lines(multi30k_dir / f"{split}.{lang}.gz", n)) + "\n",
                                                      encoding="utf-8")
    reversed_ = run_nmt("preprocess", "-r", tmp_path / "de-en", "-s", "de", "-t", "en", "--trainpref", tmp_path / "train",
                        "--vocab", run)
    assert reversed_.returncode != 0 and "pass -s en -t de" in reversed_.stderr, reversed_.stderr
    assert not (tmp_path / "de-en" / "config" / "preprocess.json").exists()
    moses = run_nmt("preprocess", "-r", tmp_path / "moses", "-s", "en", "-t", "de", "--trainpref", tmp_path / "train",
                    "--vocab", run, "--moses")
    assert moses.returncode != 0 and "drop --moses" in moses.stderr, moses.stderr
    new = tmp_path / "tuned"
    proc = run_nmt("preprocess", "-r", new, "-s", "en", "-t", "de", "--trainpref", tmp_path / "train",
                   "--validpref", tmp_path / "val", "--vocab", run)
    assert proc.returncode == 0, proc.stderr
    prep = json.loads((new / "config" / "preprocess.json").read_text())
    assert prep["vocab_type"] == "marian" and prep["special_ids"]["eos"] == 0
    base = ["train", "-r", new, "--finetune-from", run / "checkpoints" / "checkpoint_last.pt", "--max-tokens", "512",
            "--lr", "1e-4", "--warmup", "0", "--save-interval-updates", "10", "--no-epoch-checkpoints", "--threads", "1",
            "--validate-interval-updates", "10"]
    first = run_nmt(*base, "--max-update", "10")
    assert first.returncode == 0, first.stderr
    second = run_nmt(*base, "--max-update", "20")
    assert second.returncode == 0, second.stderr
    from nmt.run.checkpoint import load_checkpoint

    ckpt = load_checkpoint(new / "checkpoints" / "checkpoint_last.pt")
    assert ckpt["train_state"]["update"] == 20
    assert ckpt["config"]["activation"] == "swish" and ckpt["config"]["eos_id"] == 0
    tuned = ckpt["model"]["src_embed.weight"]
    start = load_checkpoint(run / "checkpoints" / "checkpoint_last.pt")["model"]["src_embed.weight"]
    assert not torch.equal(tuned, start)
    out = run_nmt("translate", "-r", new, input="A man rides a bike.\n\nTwo dogs play in the snow.\n")
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.splitlines()) == 3


@pytest.fixture()
def hf_folder(marian_files, tmp_path):
    tok, vocab_size = marian_files
    _save_model(tmp_path / "hf", tok, vocab_size, "opus")
    return tmp_path / "hf"


def _refused(folder: Path, run: Path, *extra: str) -> str:
    proc = run_nmt("import", "-r", run, "--from", "hf-marian", folder, *extra)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("nmt import: ")]  # progress lines aside
    assert "Traceback" not in proc.stderr and len(errors) == 1 and errors[0].startswith("nmt: error: "), proc.stderr
    assert not run.exists() and not any(p.name.startswith(f".{run.name}") for p in run.parent.iterdir())
    return proc.stderr


def test_import_errors_are_one_line(hf_folder, tmp_path):
    run = tmp_path / "run"
    config = json.loads((hf_folder / "config.json").read_text())
    (hf_folder / "config.json").write_text(json.dumps({**config, "activation_function": "gelu_new"}))
    assert "activation_function 'gelu_new'" in _refused(hf_folder, run)
    (hf_folder / "config.json").write_text(json.dumps({**config, "model_type": "bert"}))
    assert "not a Marian model" in _refused(hf_folder, run)
    (hf_folder / "config.json").write_text(json.dumps(config))
    assert "at most 256" in _refused(hf_folder, run, "--max-positions", "1000")
    (hf_folder / "vocab.json").rename(tmp_path / "vocab.json")
    assert "has no vocab.json" in _refused(hf_folder, run)
    (tmp_path / "vocab.json").rename(hf_folder / "vocab.json")
    assert "no such folder" in _refused(tmp_path / "nowhere", run)
    shutil.copy(hf_folder / "model.safetensors", tmp_path / "w")
    (hf_folder / "model.safetensors").write_bytes(b"not safetensors")
    assert "damaged" in _refused(hf_folder, run)
    shutil.copy(tmp_path / "w", hf_folder / "model.safetensors")
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    proc = run_nmt("import", "-r", run, "--from", "hf-marian", hf_folder)
    assert proc.returncode != 0 and "already holds files" in proc.stderr
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]


# -- a damaged or lying model folder is refused in one line, before anything is built ---------


def _import_refused(folder: Path, run: Path, **options) -> str:
    """The message of an import that must refuse: one line (the CLI prints an NmtError as one),
    leaving nothing where the run directory would be."""
    from nmt.errors import NmtError
    from nmt.pretrained.hf_marian import import_hf_marian

    with pytest.raises(NmtError) as refused:
        import_hf_marian(folder, run, **options)
    assert not run.exists() and not any(p.name.startswith(f".{run.name}") for p in run.parent.iterdir())
    message = str(refused.value)
    assert "\n" not in message
    return message


def _edit_json(path: Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text(encoding="utf-8")), **changes}), encoding="utf-8")


LIMITED_IMPORT = """
import resource, sys
import torch, safetensors.torch, sentencepiece
from nmt_cli.main import main
# the baseline is everything loaded; a model of the size config.json claims is gigabytes more
size = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (size + (512 << 20), resource.RLIM_INFINITY))
sys.argv = ["nmt", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize("lie", [dict(d_model=4096, encoder_layers=24, decoder_layers=24, encoder_ffn_dim=16384,
                                      decoder_ffn_dim=16384), dict(d_model=4096)], ids=["bigger", "wider"])
def test_a_config_claiming_a_bigger_model_than_its_weights_is_refused_before_it_is_built(hf_folder, tmp_path, lie):
    """A 1 MB folder whose config.json claims gigabytes: refused from the weights' shapes, in
    a process that has 512 MB of address space above what it has loaded."""
    import os
    import subprocess
    import sys

    _edit_json(hf_folder / "config.json", **lie)
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "1"}
    proc = subprocess.run([sys.executable, "-c", LIMITED_IMPORT, "import", "-r", str(run), "--from", "hf-marian",
                           str(hf_folder)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("nmt import: ")]
    assert "Traceback" not in proc.stderr and len(errors) == 1, proc.stderr
    assert str(hf_folder / "model.safetensors") in errors[0] and "config.json" in errors[0], errors[0]
    assert not run.exists()


def test_weights_of_another_dtype_are_refused(hf_folder, tmp_path):
    from safetensors.torch import load_file, save_file

    weights = hf_folder / "model.safetensors"
    state = load_file(str(weights))
    state["final_logits_bias"] = state["final_logits_bias"].long()
    save_file(state, str(weights), metadata={"format": "pt"})
    message = _import_refused(hf_folder, tmp_path / "run")
    assert str(weights) in message and "torch.int64" in message and "final_logits_bias" in message


@pytest.mark.parametrize("source_lang, target_lang, flags, named", [
    ("../../../escaped", "de", {}, "tokenizer_config.json's source_lang '../../../escaped'"),
    ("en", "de/..", {}, "tokenizer_config.json's target_lang 'de/..'"),
    ("en", 7, {}, "tokenizer_config.json's target_lang 7"),
    ("en", "de", {"source_lang": "../x"}, "--source-lang '../x'"),
    ("en", "de", {"target_lang": "de/x"}, "--target-lang 'de/x'"),
])
def test_language_codes_that_are_not_codes_are_refused(hf_folder, tmp_path, source_lang, target_lang, flags, named):
    """They name files (an export's LANG_source.spm): preprocess's rule for -s/-t applies."""
    _edit_json(hf_folder / "tokenizer_config.json", source_lang=source_lang, target_lang=target_lang)
    message = _import_refused(hf_folder, tmp_path / "run", **flags)
    assert named in message and "letters, digits, '-' and '_'" in message, message


def _damage(folder: Path, what: str, vocab_size: int) -> str:
    """Damage the model folder `folder` as `what` says; returns the name of the file that must be named."""
    import torch
    from safetensors.torch import load_file

    config = folder / "config.json"
    edits = {"d_model abc": {"d_model": "abc"}, "d_model [64]": {"d_model": [64]},
             "max_position_embeddings inf": {"max_position_embeddings": "inf"}, "d_model 64.7": {"d_model": 64.7},
             "scale_embedding 'false'": {"scale_embedding": "false"}, "vocab_size string": {"vocab_size": str(vocab_size)},
             "encoder_layers true": {"encoder_layers": True}, "dropout NaN": {"dropout": float("nan")}}
    if what in edits:
        _edit_json(config, **edits[what])
        return "config.json"
    if what == "string id in vocab.json":
        vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
        vocab["<unk>"] = "1"
        (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
        return "vocab.json"
    if what == "vocab.json not JSON":
        (folder / "vocab.json").write_text('{"</s>": 0,', encoding="utf-8")
        return "vocab.json"
    if what == "an id twice in vocab.json":
        _edit_json(folder / "vocab.json", **{"<unk>": 0})
        return "vocab.json"
    if what == "a non-tensor in the weights":
        state = load_file(str(folder / "model.safetensors"))
        (folder / "model.safetensors").unlink()
        torch.save({**state, "final_logits_bias": [0.0] * vocab_size}, folder / "pytorch_model.bin")
        return "pytorch_model.bin"
    if what in ("broken source.spm", "empty target.spm"):
        name = what.split()[1]
        (folder / name).write_bytes(b"garbage" if what.startswith("broken") else b"")
        return name
    assert what == "tokenizer_config.json a list"
    (folder / "tokenizer_config.json").write_text('["en", "de"]', encoding="utf-8")
    return "tokenizer_config.json"


@pytest.mark.parametrize("what", [
    "d_model abc", "d_model [64]", "max_position_embeddings inf", "d_model 64.7", "scale_embedding 'false'",
    "vocab_size string", "encoder_layers true", "dropout NaN", "string id in vocab.json", "vocab.json not JSON",
    "an id twice in vocab.json", "a non-tensor in the weights", "broken source.spm", "empty target.spm",
    "tokenizer_config.json a list",
])
def test_a_damaged_model_folder_is_one_line_naming_its_own_file(hf_folder, marian_files, tmp_path, what):
    """Nothing is coerced (64.7 is no d_model, "false" no boolean), and the file named is the
    model folder's, with no advice to re-run the import that fails the same way."""
    name = _damage(hf_folder, what, marian_files[1])
    message = _import_refused(hf_folder, tmp_path / "run")
    assert str(hf_folder / name) in message and "re-run" not in message, message
    if name == "config.json":
        key = what.split()[0]
        assert f"says {key} " in message and "must be" in message, message


class _Payload:
    """A pickle that creates `marker` when it is loaded with more than tensors allowed."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return open, (self.marker, "w")


def test_a_pickle_payload_is_refused_without_advice_to_run_it(hf_folder, tmp_path):
    from safetensors.torch import load_file

    marker = tmp_path / "payload-ran"
    state = load_file(str(hf_folder / "model.safetensors"))
    (hf_folder / "model.safetensors").unlink()
    torch.save({**state, "final_logits_bias": _Payload(str(marker))}, hf_folder / "pytorch_model.bin")
    message = _import_refused(hf_folder, tmp_path / "run")
    assert str(hf_folder / "pytorch_model.bin") in message and "more than tensors" in message, message
    assert "weights_only" not in message and "False" not in message and "can still be loaded" not in message
    assert not marker.exists()


# -- one import at a time per run directory; what a killed one leaves is removed -----------------


def test_an_import_into_a_run_dir_another_command_writes_is_refused(hf_folder, tmp_path):
    from nmt.run.lock import RunLock

    run = tmp_path / "run"
    with RunLock(run, "nmt train -r run"):
        proc = run_nmt("import", "-r", run, "--from", "hf-marian", hf_folder)
        assert_one_line_error(proc, str(run), "in use by", "nmt train -r run")
    assert not run.exists()


def test_two_imports_into_one_new_run_dir_make_one_run_and_one_line(hf_folder, tmp_path):
    import subprocess

    run = tmp_path / "run"
    procs = [start_nmt("import", "-r", run, "--from", "hf-marian", hf_folder, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(proc.wait(timeout=600), proc.stderr.read()) for proc in procs]
    for proc in procs:
        proc.stdout.close(), proc.stderr.close()
    assert sorted(code == 0 for code, _ in results) == [False, True], results
    stderr = next(err for code, err in results if code != 0)
    errors = [line for line in stderr.splitlines() if not line.startswith("nmt import: ")]
    assert "Traceback" not in stderr and len(errors) == 1, stderr
    assert "in use by" in errors[0] or "already holds files" in errors[0], errors[0]
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "config", "vocab"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".run")] == []


KILLED_IMPORT = """
import os, sys
import nmt.run.checkpoint
nmt.run.checkpoint.save_checkpoint = lambda *args, **kwargs: os._exit(9)  # killed while writing the run
from nmt_cli.main import main
sys.argv = ["nmt", *sys.argv[1:]]
main()
"""


def test_the_staging_folder_of_a_killed_import_is_removed_by_the_next(hf_folder, tmp_path):
    import subprocess
    import sys

    from nmt.pretrained.hf_marian import import_hf_marian

    run = tmp_path / "run"
    killed = subprocess.run([sys.executable, "-c", KILLED_IMPORT, "import", "-r", str(run), "--from", "hf-marian",
                             str(hf_folder)], capture_output=True, text=True, timeout=600)
    assert killed.returncode == 9, killed.stderr
    assert not run.exists() and [p for p in tmp_path.iterdir() if p.name.startswith(".run") and p.is_dir()]
    notes: list[str] = []
    import_hf_marian(hf_folder, run, progress=notes.append)
    assert any("left by an interrupted import" in note for note in notes), notes
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".run")] == []
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "config", "vocab"]


def test_an_empty_run_dir_is_imported_into(hf_folder, tmp_path):
    from nmt.pretrained.hf_marian import import_hf_marian

    run = tmp_path / "run"
    run.mkdir()
    import_hf_marian(hf_folder, run)
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "config", "vocab"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".run")] == []


# -- export: a run's language code names files, so it must be a code --------------------------


def test_export_refuses_a_run_whose_language_code_would_write_outside_its_folder(hf_folder, tmp_path):
    """A run directory imported by an older nmt, which took tokenizer_config.json's source_lang
    as it was: export refuses it rather than write `../../../escaped_source.spm`."""
    pytest.importorskip("ctranslate2")
    from nmt.errors import NmtError
    from nmt.export.ctranslate2 import export_ctranslate2
    from nmt.pretrained.hf_marian import import_hf_marian
    from nmt.run.checkpoint import load_checkpoint, save_checkpoint
    from nmt.run.directory import RunDir
    from nmt.run.identity import IDENTITY_KEY, run_identity

    run = tmp_path / "run"
    import_hf_marian(hf_folder, run)
    record_path = run / "config" / "preprocess.json"
    bad = "../../../escaped"
    record_path.write_text(record_path.read_text(encoding="utf-8").replace('"en"', json.dumps(bad)), encoding="utf-8")
    checkpoint = run / "checkpoints" / "checkpoint_last.pt"
    ckpt = load_checkpoint(checkpoint)
    save_checkpoint(checkpoint, {**ckpt, IDENTITY_KEY: run_identity(RunDir(run))})  # as that nmt wrote it
    output = tmp_path / "a" / "b" / "c" / "model"
    with pytest.raises(NmtError, match=r"preprocess.json's source_lang '\.\./\.\./\.\./escaped' may only hold"):
        export_ctranslate2(run, output)
    assert [p for p in tmp_path.rglob("*escaped*")] == []
    assert not output.exists()


def test_an_imported_teacher_distills_as_it_translates(imported, multi30k_dir, tmp_path):
    _, _, run, _ = imported
    lines = _lines(multi30k_dir / "test_2016_flickr.en.gz", 20) + [""]
    src = tmp_path / "mono.en"
    src.write_text("".join(l + "\n" for l in lines), encoding="utf-8")
    proc = run_nmt("distill", "-r", run, "--source", src, "-o", tmp_path / "out", "--threads", "1", "--quiet")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "out/summary.json").read_text())
    assert summary["lines"] == 21 and summary["empty"] == 1
    target = Path(summary["target"]).read_text(encoding="utf-8").splitlines()
    plain = run_nmt("translate", "-r", run, "--threads", "1", "--quiet", "--input", src)
    assert plain.returncode == 0, plain.stderr
    assert target == plain.stdout.splitlines()
