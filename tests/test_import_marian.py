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

from conftest import run_nmt

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
