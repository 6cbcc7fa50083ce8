"""`nmt export --format ctranslate2`: a run's model as a CTranslate2 model directory.

The model is described through CTranslate2's own `specs` API (a `TransformerSpec` filled by a
`ctranslate2.converters.Converter`), which validates it, quantizes it and writes model.bin,
config.json and the vocabulary; the file format is never written by hand here. The directory
also holds the run's tokenizer file(s) and nmt_export.json (languages, Moses setting, which
tokenizer is which), so the model is usable without nmt:

    pieces = sentencepiece.encode(line, out_type=str)
    ctranslate2.Translator(DIR).translate_batch([pieces], return_end_token=True, ...)

What has to be said explicitly, because CTranslate2's defaults differ from nmt:
  * positions: nmt's sinusoids are interleaved by default (sin in even, cos in odd dimensions,
    Section 3.5) and start at position 0; CTranslate2's built-in table concatenates them, so the
    model's own table, in either `positions_layout`, is written as `position_encodings`;
  * the feed-forward activation (`activation`: relu, swish or gelu) and the pre-softmax
    `output_bias`, when the model has one, as the decoder projection's bias;
  * special tokens: the decoder starts from bos (<s>), and the source gets eos (</s>)
    appended, as nmt's batches do (`decoder_start_token`, `add_source_eos`);
  * post-LN layers unless the run was trained with --pre-ln; sqrt(d_model)-scaled embeddings.

nmt_export.json also carries the run's vocabulary identity (`nmt.run.identity`): token ids are
only meaningful with the vocabulary they were trained with, and sizes alone do not tell two
vocabularies apart, so both the export and whoever loads it (`read_export_record`) check it.
It also keeps the checkpoint's own identity, model configuration and parameter count, so
translating and serving an export never load the checkpoint (nor torch) to ask them.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

from nmt.data.tokenizer import VOCAB_TYPES, tokenizer_filename
from nmt.errors import NmtError
from nmt.preprocess.config import check_language_code
from nmt.preprocess.vocab_learning import MARIAN_FILES
from nmt.run.replace import check_replaceable, holds_only

QUANTIZATIONS = ("int8", "int8_float32", "float16", "bfloat16")
EXPORT_RECORD = "nmt_export.json"
RECORD_FIELDS = ("format", "checkpoint", "source_lang", "target_lang", "tokenizer", "identity", "max_positions")
CT2_FILES = ("model.bin", "config.json", "shared_vocabulary.json", "source_vocabulary.json", "target_vocabulary.json")
"""What CTranslate2's converter writes into a model directory (specs.ModelSpec.save)."""


def import_ctranslate2() -> Any:
    try:
        import ctranslate2
    except ImportError:
        raise NmtError("CTranslate2 is not installed; install it with `pip install 'nmt[ct2]'` (or `make install`)") from None
    return ctranslate2


def read_export_record(model_dir: str | Path) -> dict[str, Any]:
    """DIR/nmt_export.json, checked for the fields nmt reads; anything else is one line that
    says to export again."""
    path = Path(model_dir) / EXPORT_RECORD
    if not path.is_file():
        raise NmtError(f"{model_dir} is not a model written by `nmt export --format ctranslate2` (no {EXPORT_RECORD})")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise NmtError(f"cannot read {path} ({e}); export the model again with `nmt export`") from None
    missing = [field for field in RECORD_FIELDS if not isinstance(record, dict) or field not in record]
    if missing:
        raise NmtError(f"{path} lacks {', '.join(missing)} (written by an older nmt, or damaged); "
                       f"export the model again with `nmt export`")
    try:  # the entries read later, read here once
        identity = record["identity"]
        for side in ("source_lang", "target_lang"):
            identity["vocab_sha256"][identity[side]]
        int(record["max_positions"])
    except (TypeError, KeyError, ValueError):
        raise NmtError(f"{path} is damaged (identity or max_positions); export the model again with `nmt export`") from None
    return record


def export_file_names(src_lang: str, tgt_lang: str) -> set[str]:
    """Every name an export of a run in these languages can write: CTranslate2's files, the
    record, and the run's tokenizer file(s) under their vocab/ name (preprocess: joint.* or
    LANG.*; import: source.spm, target.spm), prefixed LANG_ when each side has its own."""
    vocab = {tokenizer_filename(kind, name) for kind in VOCAB_TYPES for name in ("joint", src_lang, tgt_lang)}
    vocab |= set(MARIAN_FILES.values())
    return {EXPORT_RECORD, *CT2_FILES, *vocab, *(f"{lang}_{name}" for lang in (src_lang, tgt_lang) for name in vocab)}


def is_export(folder: Path) -> bool:
    """Whether `folder` is an earlier export: its nmt_export.json and only files of the names an
    export writes (`export_file_names` of the record's languages). Names are never taken from
    the record itself: a hand-made one could list any file for --force to delete."""
    try:
        record = json.loads((folder / EXPORT_RECORD).read_text(encoding="utf-8"))
        langs = [check_language_code(side, record[side]) for side in ("source_lang", "target_lang")]
    except (OSError, ValueError, TypeError, KeyError, NmtError):
        return False
    names = export_file_names(*langs)
    return holds_only(folder, lambda name: name in names)


def vocabulary_tokens(tokenizer: Any) -> list[str]:
    """The token string of every id, in id order (CTranslate2 maps tokens to ids by position)."""
    return tokenizer.pieces()


def alignment_layer(decoder_layers: int) -> int:
    """The decoder layer (from 0) whose heads' mean attention an export returns to `return_attention`:
    the last, as `nmt translate --alignment-layer` -1 (its default, fairseq's) chooses; written here
    because export never imports `nmt.inference` (tests/test_ctranslate2.py holds the two together)."""
    return decoder_layers - 1


def _fill_spec(model: Any, src_tokens: list[str], tgt_tokens: list[str]) -> Any:
    """A CTranslate2 TransformerSpec holding `model`'s weights (float32 numpy arrays)."""
    from ctranslate2.specs import Activation, transformer_spec

    cfg = model.cfg
    # torch's F.gelu is the exact (erf) GELU, CTranslate2's GELU; GELUTanh is the approximation
    activation = {"relu": Activation.RELU, "swish": Activation.SWISH, "gelu": Activation.GELU}[cfg.activation]
    # return_attention gives nmt's alignment attention: the default layer, every head averaged
    spec = transformer_spec.TransformerSpec.from_config((cfg.encoder_layers, cfg.decoder_layers), cfg.n_heads, pre_norm=cfg.pre_ln,
                                                        activation=activation,
                                                        alignment_layer=alignment_layer(cfg.decoder_layers), alignment_heads=cfg.n_heads)

    def array(t: Any) -> Any:
        return t.detach().float().cpu().numpy()

    def linear(dst: Any, src: Any) -> None:
        dst.weight = array(src.weight)
        if src.bias is not None:
            dst.bias = array(src.bias)

    def norm(dst: Any, src: Any) -> None:
        dst.gamma, dst.beta = array(src.weight), array(src.bias)

    def ffn(dst: Any, block: Any, ffn_module: Any) -> None:
        norm(dst.layer_norm, block.norm)
        linear(dst.linear_0, ffn_module.fc1)
        linear(dst.linear_1, ffn_module.fc2)

    positions = array(model.positions)  # (max_positions, d_model), in the model's positions_layout
    for side, embed, layers in ((spec.encoder, model.src_embed, model.encoder_layers),
                                (spec.decoder, model.tgt_embed, model.decoder_layers)):
        embeddings = side.embeddings[0] if isinstance(side.embeddings, list) else side.embeddings
        embeddings.weight = array(embed.weight)
        side.scale_embeddings = True  # sqrt(d_model), Section 3.4
        side.position_encodings.encodings = positions
    for dst, layer in zip(spec.encoder.layer, model.encoder_layers):
        linear(dst.self_attention.linear[0], layer.self_attn.qkv_proj)  # fused q, k, v in that order
        linear(dst.self_attention.linear[1], layer.self_attn.out_proj)
        norm(dst.self_attention.layer_norm, layer.attn_block.norm)
        ffn(dst.ffn, layer.ffn_block, layer.ffn)
    for dst, layer in zip(spec.decoder.layer, model.decoder_layers):
        linear(dst.self_attention.linear[0], layer.self_attn.qkv_proj)
        linear(dst.self_attention.linear[1], layer.self_attn.out_proj)
        norm(dst.self_attention.layer_norm, layer.self_block.norm)
        linear(dst.attention.linear[0], layer.cross_attn.q_proj)
        linear(dst.attention.linear[1], layer.cross_attn.kv_proj)  # fused k, v
        linear(dst.attention.linear[2], layer.cross_attn.out_proj)
        norm(dst.attention.layer_norm, layer.cross_block.norm)
        ffn(dst.ffn, layer.ffn_block, layer.ffn)
    if cfg.pre_ln:
        norm(spec.encoder.layer_norm, model.encoder_norm)
        norm(spec.decoder.layer_norm, model.decoder_norm)
    spec.decoder.projection.weight = array(model.output_weight)
    if model.output_bias is not None:
        spec.decoder.projection.bias = array(model.output_bias)

    spec.register_source_vocabulary(src_tokens)
    spec.register_target_vocabulary(tgt_tokens)
    spec.config.unk_token = tgt_tokens[cfg.unk_id]
    spec.config.bos_token = tgt_tokens[cfg.bos_id]
    spec.config.eos_token = tgt_tokens[cfg.eos_id]
    spec.config.decoder_start_token = tgt_tokens[cfg.bos_id]  # the decoder starts from bos (Marian's: <pad>)
    spec.config.add_source_eos = True  # nmt's sources end with eos
    spec.config.add_source_bos = False
    return spec


def _warn(message: str) -> None:
    print(f"nmt export: warning: {message}", file=sys.stderr)


def export_ctranslate2(run_dir: str | Path, output: str | Path, checkpoint: Optional[str | Path] = None,
                       quantization: Optional[str] = None, force: bool = False,
                       warn: Callable[[str], None] = _warn) -> Path:
    """Write the run's model (its default checkpoint unless `checkpoint`) to `output`.

    The directory appears whole or not at all: it is built beside `output` and renamed. With
    `force`, an earlier export at `output` is replaced, and nothing else (`nmt.run.replace`).
    A checkpoint trained with another vocabulary than the run's is refused (`nmt.run.identity`).
    """
    output = Path(output)
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise NmtError(f"unknown --quantization {quantization!r}; choose one of {', '.join(QUANTIZATIONS)}")
    if os.path.lexists(output) and not force:
        raise NmtError(f"{output} already exists; remove it or pass --force to replace it")
    what = f"an earlier export (a folder holding {EXPORT_RECORD} and only the files an export writes)"
    check_replaceable(output, "-o", what, is_export)  # before any work, so a refusal costs nothing

    import torch

    from nmt.run.checkpoint import load_checkpoint, load_stock_model
    from nmt.run.checkpoint_choice import default_checkpoint, resolve_checkpoint
    from nmt.run.identity import check_identity, checkpoint_identity, run_identity
    from nmt.run.directory import RunDir
    from nmt.data.tokenizer import load_tokenizer
    from nmt.model.transformer import count_parameters

    ctranslate2 = import_ctranslate2()
    run = RunDir(Path(run_dir))
    record = run.read_record("preprocess")
    src_lang, tgt_lang = (check_language_code(f"{run.record_path('preprocess')}'s {side}", record.get(side))
                          for side in ("source_lang", "target_lang"))  # they name files of the export
    identity = run_identity(run)
    path = resolve_checkpoint(run, checkpoint) if checkpoint is not None else default_checkpoint(run)
    ckpt_identity = checkpoint_identity(load_checkpoint(path, mmap=True))
    check_identity(ckpt_identity, identity, f"checkpoint {path}", warn)
    model = load_stock_model(path, torch.device("cpu"), torch.float32, warn=warn)  # weights only: no device ops to build
    vocab_files = {lang: run.root / record["vocab"][lang] for lang in (src_lang, tgt_lang)}
    src_tok, tgt_tok = (load_tokenizer(vocab_files[lang], num_threads=1) for lang in (src_lang, tgt_lang))
    spec = _fill_spec(model, vocabulary_tokens(src_tok), vocabulary_tokens(tgt_tok))

    class _NmtConverter(ctranslate2.converters.Converter):
        def _load(self) -> Any:
            return spec

    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        built = Path(_NmtConverter().convert(str(staging / "model"), quantization=quantization))
        tokenizer_files = {}
        for lang, file in vocab_files.items():
            name = f"{lang}_{file.name}" if len(set(vocab_files.values())) > 1 else file.name
            shutil.copyfile(file, built / name)
            tokenizer_files[lang] = name
        (built / EXPORT_RECORD).write_text(json.dumps({
            "format": "ctranslate2", "checkpoint": str(path.resolve()), "source_lang": src_lang, "target_lang": tgt_lang,
            "tokenizer": tokenizer_files, "moses": bool(record.get("moses")), "quantization": quantization,
            "max_positions": model.cfg.max_positions, "identity": identity,
            # what `nmt translate/serve --engine ctranslate2` would otherwise load the checkpoint with torch for
            "checkpoint_identity": ckpt_identity, "model": model.cfg.to_dict(), "parameters": count_parameters(model),
            "alignment_layer": alignment_layer(model.cfg.decoder_layers),
        }, indent=2) + "\n", encoding="utf-8")
        if os.path.lexists(output):  # checked above: an earlier export; it goes with the staging folder
            os.rename(output, staging / "replaced")
        built.rename(output)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return output
