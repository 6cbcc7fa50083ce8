"""`nmt import --from hf-marian`: an OPUS-MT / Marian model, saved as a Hugging Face
`MarianMTModel` folder, made into an nmt run directory.

A Marian model is the paper's post-LN Transformer with four differences, each an ordinary
`TransformerConfig` field here: the feed-forward activation (swish), the layout of the
sinusoids (sines in the first half of the dimensions, cosines in the second), a bias on the
output logits (`final_logits_bias`), and its special ids (eos 0, unk 1, pad last; the decoder
starts from <pad>). Its vocabulary is two SentencePiece models, source.spm and target.spm,
whose pieces take their ids from one vocab.json (`nmt.data.tokenizer.MarianTokenizer`).

Nothing is downloaded and `transformers` is not needed: the folder's config.json is read
with MarianConfig's defaults for keys it leaves out (transformers writes only the values that
differ from them), and its weights with safetensors, or with `torch.load(weights_only=True)`
for a pytorch_model.bin. Every file is checked before the model is built (values of the types
MarianConfig gives them, tensors of the shapes config.json makes them), so a damaged or lying
folder is one line naming its own file. What the run directory holds:

    config/preprocess.json        languages, vocabulary, special ids, where the model came from
    vocab/source.spm, target.spm, vocab.json
    checkpoints/checkpoint_last.pt   the model only (no optimizer, no training position)

The mapping of every setting and weight is in docs/pretrained.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import reprlib
import shutil
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from nmt.errors import NmtError
from nmt.model.config import TransformerConfig
from nmt.preprocess.config import check_language_code
from nmt.run.directory import RunDir

MARIAN_DEFAULTS: dict[str, Any] = {
    "vocab_size": 58101, "decoder_vocab_size": None, "max_position_embeddings": 1024,
    "encoder_layers": 12, "encoder_ffn_dim": 4096, "encoder_attention_heads": 16,
    "decoder_layers": 12, "decoder_ffn_dim": 4096, "decoder_attention_heads": 16,
    "activation_function": "gelu", "d_model": 1024, "dropout": 0.1, "attention_dropout": 0.0,
    "activation_dropout": 0.0, "decoder_start_token_id": 58100, "scale_embedding": False,
    "pad_token_id": 58100, "eos_token_id": 0, "share_encoder_decoder_embeddings": True,
    "tie_word_embeddings": True,
}
"""transformers' MarianConfig defaults: a saved config.json leaves out the values equal to these."""

ACTIVATIONS = {"swish": "swish", "silu": "swish", "relu": "relu", "gelu": "gelu"}
"""Marian's activation_function -> TransformerConfig.activation (transformers' "gelu" is the exact, erf one)."""

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
MARIAN_NORMALIZATION = ("Marian: source.spm and target.spm's own normalization rules (OPUS-MT: nmt_nfkc); pieces "
                        "missing from vocab.json become <unk>, decoded as ' \u2047 '")
TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json")
DAMAGED = "the model folder is damaged; download or save it again"


@dataclass
class ImportResult:
    run_dir: Path
    config: TransformerConfig
    parameters: int
    source_lang: str
    target_lang: str


def read_json_object(path: Path, what: str) -> dict[str, Any]:
    """The JSON object in the model folder's file `path` (`what` it should be); one line naming
    that file when it is damaged or holds something else."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise NmtError(f"cannot read {path} ({type(e).__name__}); {DAMAGED}") from None
    if not isinstance(value, dict):
        raise NmtError(f"{path} is not {what} (a JSON object); {DAMAGED}")
    return value


def config_type_problem(value: Any, default: Any) -> Optional[str]:
    """What `value` must be and is not, judged by MarianConfig's default for its key, or None.
    Nothing is coerced: int() makes 64.7 a d_model of 64, bool("false") is True, and a string
    "1103" is no vocab_size, so each is refused rather than read as something else."""
    if isinstance(default, bool):
        return None if isinstance(value, bool) else "true or false"
    if isinstance(default, float):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if number and math.isfinite(value) else "a finite number"
    if isinstance(default, str):
        return None if isinstance(value, str) else "a string"
    whole = isinstance(value, int) and not isinstance(value, bool)  # an int, or None: decoder_vocab_size
    return None if whole or (default is None and value is None) else "a whole number"


def read_marian_config(folder: Path) -> dict[str, Any]:
    """config.json with MarianConfig's defaults filled in, each value of its default's type; one
    line for what is not a Marian model."""
    path = folder / "config.json"
    if not path.is_file():
        raise NmtError(f"{folder} is not a Hugging Face model folder ({path.name} is missing); "
                       f"give the folder that `save_pretrained` or `huggingface-cli download` wrote")
    config = read_json_object(path, "a model configuration")
    kind = config.get("model_type")
    if kind != "marian":
        raise NmtError(f"{folder} is not a Marian model (config.json says model_type {reprlib.repr(kind)}); "
                       f"`nmt import --from hf-marian` reads MarianMTModel folders such as Helsinki-NLP/opus-mt-*")
    marian = {**MARIAN_DEFAULTS, **{k: v for k, v in config.items() if v is not None or k not in MARIAN_DEFAULTS}}
    for key, default in MARIAN_DEFAULTS.items():
        problem = config_type_problem(marian[key], default)
        if problem is not None:
            raise NmtError(f"{path} says {key} {reprlib.repr(marian[key])}, which must be {problem}; "
                           f"the file is damaged or was not written by transformers")
    return marian


def embedding_matrices(hf: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(source embeddings, target embeddings, output layer) of a MarianMTModel state dict.
    A file holds the tied ones once (`model.shared`) or under every name (older files), and
    transformers 5 with tie_word_embeddings false unties all three: the tensors tell."""
    shared = hf.get("model.shared.weight")
    src = hf.get("model.encoder.embed_tokens.weight", shared)
    tgt = hf.get("model.decoder.embed_tokens.weight", shared)
    out = hf.get("lm_head.weight", tgt)
    if src is None or tgt is None:
        raise NmtError("the model's weights have no model.shared.weight (nor encoder/decoder embed_tokens); "
                       "the weight file does not match config.json")
    return src, tgt, out


def transformer_config(marian: dict[str, Any], vocab_size: int, special: Any, hf: dict[str, Any],
                       max_positions: Optional[int] = None) -> TransformerConfig:
    """The TransformerConfig of a Marian configuration and its weights `hf` (which matrices
    are tied); an unsupported setting is named."""
    import torch

    def unsupported(what: str) -> NmtError:
        return NmtError(f"this Marian model has {what}, which nmt's Transformer does not support; it cannot be imported")

    if marian["encoder_attention_heads"] != marian["decoder_attention_heads"]:
        raise unsupported(f"encoder_attention_heads {marian['encoder_attention_heads']} and "
                          f"decoder_attention_heads {marian['decoder_attention_heads']} (nmt has one n_heads)")
    if marian["encoder_ffn_dim"] != marian["decoder_ffn_dim"]:
        raise unsupported(f"encoder_ffn_dim {marian['encoder_ffn_dim']} and decoder_ffn_dim "
                          f"{marian['decoder_ffn_dim']} (nmt has one d_ff)")
    activation = ACTIVATIONS.get(str(marian["activation_function"]))
    if activation is None:
        raise unsupported(f"activation_function {marian['activation_function']!r} (nmt has {', '.join(ACTIVATIONS)})")
    if not marian["scale_embedding"]:
        raise unsupported("scale_embedding false (nmt always scales embeddings by sqrt(d_model), paper 3.4)")
    shared = bool(marian["share_encoder_decoder_embeddings"])
    decoder_vocab = marian["decoder_vocab_size"] or marian["vocab_size"]
    if not shared and decoder_vocab != marian["vocab_size"]:
        raise unsupported(f"a decoder vocabulary of its own (decoder_vocab_size {decoder_vocab} vs vocab_size "
                          f"{marian['vocab_size']}, separate_vocabs)")
    if marian["vocab_size"] != vocab_size:
        raise NmtError(f"config.json says vocab_size {marian['vocab_size']}, but vocab.json holds {vocab_size} pieces; "
                       f"the folder's files do not belong together")
    for key, expected in (("pad_token_id", special.pad), ("eos_token_id", special.eos)):
        if marian[key] != expected:
            raise NmtError(f"config.json says {key} {marian[key]}, but vocab.json gives {expected}; "
                           f"the folder's files do not belong together")
    if marian["decoder_start_token_id"] != special.pad:
        raise unsupported(f"decoder_start_token_id {marian['decoder_start_token_id']} (Marian models start from "
                          f"<pad>, {special.pad})")
    model_positions = int(marian["max_position_embeddings"])
    limit = int(TransformerConfig.RANGES["max_positions"].high)
    if model_positions > limit:
        raise NmtError(f"this model has max_position_embeddings {model_positions}, more than nmt's --max-positions "
                       f"allows ({limit}); import it with --max-positions {limit} or less")
    if max_positions is not None and max_positions > model_positions:
        raise NmtError(f"--max-positions {max_positions} is more than the model's max_position_embeddings "
                       f"{model_positions} (it never saw longer sequences); give at most {model_positions}")
    src, tgt, out = embedding_matrices(hf)
    tied_output = out is tgt or (out.shape == tgt.shape and torch.equal(out, tgt))
    tied_inputs = src is tgt or (src.shape == tgt.shape and torch.equal(src, tgt))
    cfg = TransformerConfig(
        src_vocab_size=vocab_size, tgt_vocab_size=vocab_size, d_model=int(marian["d_model"]),
        d_ff=int(marian["encoder_ffn_dim"]), n_heads=int(marian["encoder_attention_heads"]),
        encoder_layers=int(marian["encoder_layers"]), decoder_layers=int(marian["decoder_layers"]),
        dropout=float(marian["dropout"]), attention_dropout=float(marian["attention_dropout"]),
        relu_dropout=float(marian["activation_dropout"]), activation=activation,
        max_positions=max_positions or model_positions,
        # nmt ties all three matrices, or target input and output, or none: shared input
        # embeddings with an untied output layer (transformers 4) become two copies.
        share_all_embeddings=tied_inputs and tied_output, share_decoder_input_output_embed=tied_output,
        pre_ln=False, positions_layout="halves", output_bias=True,
        pad_id=special.pad, unk_id=special.unk, bos_id=special.bos, eos_id=special.eos,
    )
    cfg.validate()
    return cfg


def load_marian_weights(folder: Path) -> tuple[dict[str, Any], Path]:
    """The folder's tensors by name: model.safetensors, else pytorch_model.bin, read as tensors
    only (`weights_only=True`: what else a pickle holds never runs) and checked to be named
    floating-point tensors, so that a foreign file is one line here, not a traceback later."""
    import pickle

    import torch

    for name in WEIGHT_FILES:
        path = folder / name
        if not path.is_file():
            continue
        try:
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                state = load_file(str(path))
            else:
                state = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:  # torch's message would advise weights_only=False: never
            raise NmtError(f"{path} holds more than tensors (or is damaged); nmt loads tensors only and never runs "
                           f"the Python objects a pickle can hold, so it cannot import this file") from None
        except Exception as e:  # safetensors and torch raise many types for a damaged file
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise NmtError(f"cannot read the weights in {path} ({reason}); it is damaged") from None
        if not isinstance(state, dict):
            raise NmtError(f"{path} holds a {type(state).__name__}, not a state dict of named tensors")
        for key, value in state.items():
            if not isinstance(key, str) or not isinstance(value, torch.Tensor) or not value.is_floating_point():
                what = f"a {value.dtype} tensor" if isinstance(value, torch.Tensor) else f"a {type(value).__name__}"
                raise NmtError(f"{path} holds {reprlib.repr(key)}: {what}, where a Marian model has floating-point "
                               f"tensors only; it is damaged or not a MarianMTModel's weights")
        return state, path
    raise NmtError(f"{folder} has no weights ({' or '.join(WEIGHT_FILES)} is missing)")


def nmt_state_dict(hf: dict[str, Any], cfg: TransformerConfig, weights: Path) -> dict[str, Any]:
    """nmt's parameter names and layout for a MarianMTModel state dict `hf` (read from
    `weights`): q, k, v of self-attention become one qkv_proj (and k, v of encoder-decoder
    attention one kv_proj), in that order; the rest is a renaming.

    A missing tensor is named, and every tensor is checked against the shape `cfg` gives it
    before it is used. The shapes come from nmt's model laid out on PyTorch's meta device,
    which allocates nothing: a config.json that claims a far bigger model than its weights
    hold is refused here, before a model of that size is built."""
    import torch

    from nmt.model.transformer import Transformer

    with torch.device("meta"):
        expected = {name: tensor.shape for name, tensor in Transformer(cfg).state_dict().items()}

    def get(name: str) -> tuple[str, Any]:
        if name not in hf:
            raise NmtError(f"{weights} has no {name}; the weight file does not match config.json")
        return name, hf[name]

    out: dict[str, Any] = {}

    def put(dst: str, *parts: tuple[str, Any]) -> None:
        """out[dst]: the tensors `parts` (name, tensor) stacked along the first dimension."""
        shape = expected[dst]
        each = [shape[0] // len(parts), *shape[1:]]
        for name, tensor in parts:
            if list(tensor.shape) != each:
                raise NmtError(f"the weights in {weights} do not fit config.json: {name} is {list(tensor.shape)}, "
                               f"config.json makes it {each}")
        out[dst] = torch.cat([tensor for _, tensor in parts], 0) if len(parts) > 1 else parts[0][1]

    def linear(dst: str, *srcs: str) -> None:
        put(f"{dst}.weight", *(get(f"{s}.weight") for s in srcs))
        put(f"{dst}.bias", *(get(f"{s}.bias") for s in srcs))

    def norm(dst: str, src: str) -> None:
        put(f"{dst}.weight", get(f"{src}.weight"))
        put(f"{dst}.bias", get(f"{src}.bias"))

    src, tgt, output = embedding_matrices(hf)
    put("src_embed.weight", ("the source embeddings", src))
    # shared: one matrix under both names, as nmt's state dict has it
    put("tgt_embed.weight", ("the target embeddings", src if cfg.share_all_embeddings else tgt))
    if not cfg.share_decoder_input_output_embed:
        put("output_proj.weight", ("the output layer", output))
    bias_name, bias = get("final_logits_bias")
    put("output_bias", (bias_name, bias.reshape(-1)))
    for i in range(cfg.encoder_layers):
        src, dst = f"model.encoder.layers.{i}", f"encoder_layers.{i}"
        attn = f"{src}.self_attn"
        linear(f"{dst}.self_attn.qkv_proj", f"{attn}.q_proj", f"{attn}.k_proj", f"{attn}.v_proj")
        linear(f"{dst}.self_attn.out_proj", f"{attn}.out_proj")
        norm(f"{dst}.attn_block.norm", f"{src}.self_attn_layer_norm")
        linear(f"{dst}.ffn.fc1", f"{src}.fc1")
        linear(f"{dst}.ffn.fc2", f"{src}.fc2")
        norm(f"{dst}.ffn_block.norm", f"{src}.final_layer_norm")
    for i in range(cfg.decoder_layers):
        src, dst = f"model.decoder.layers.{i}", f"decoder_layers.{i}"
        attn, cross = f"{src}.self_attn", f"{src}.encoder_attn"
        linear(f"{dst}.self_attn.qkv_proj", f"{attn}.q_proj", f"{attn}.k_proj", f"{attn}.v_proj")
        linear(f"{dst}.self_attn.out_proj", f"{attn}.out_proj")
        norm(f"{dst}.self_block.norm", f"{src}.self_attn_layer_norm")
        linear(f"{dst}.cross_attn.q_proj", f"{cross}.q_proj")
        linear(f"{dst}.cross_attn.kv_proj", f"{cross}.k_proj", f"{cross}.v_proj")
        linear(f"{dst}.cross_attn.out_proj", f"{cross}.out_proj")
        norm(f"{dst}.cross_block.norm", f"{src}.encoder_attn_layer_norm")
        linear(f"{dst}.ffn.fc1", f"{src}.fc1")
        linear(f"{dst}.ffn.fc2", f"{src}.fc2")
        norm(f"{dst}.ffn_block.norm", f"{src}.final_layer_norm")
    if f"model.encoder.layers.{cfg.encoder_layers}.fc1.weight" in hf or f"model.decoder.layers.{cfg.decoder_layers}.fc1.weight" in hf:
        raise NmtError(f"{weights} has more layers than config.json says; the weight file does not match it")
    return {k: v.float().contiguous() for k, v in out.items()}


def languages(folder: Path, source_lang: Optional[str], target_lang: Optional[str]) -> tuple[str, str, dict[str, Any]]:
    """The languages (the flags, else tokenizer_config.json's source_lang / target_lang), each a
    language code by preprocess's rule (they name files), and that file."""
    path = folder / "tokenizer_config.json"
    tok_cfg = read_json_object(path, "a tokenizer configuration") if path.is_file() else {}
    if tok_cfg.get("separate_vocabs") not in (None, False):
        raise NmtError(f"{path} sets separate_vocabs (a target vocabulary of its own), which nmt's import does not "
                       f"support; it cannot be imported")
    codes = []
    for flag, given, key in (("--source-lang", source_lang, "source_lang"), ("--target-lang", target_lang, "target_lang")):
        code = given or tok_cfg.get(key)
        if code is None or code == "":
            raise NmtError(f"{folder} does not say its languages ({path.name} has no source_lang / target_lang); "
                           f"pass --source-lang and --target-lang")
        codes.append(check_language_code(flag if given else f"{path}'s {key}", code))
    return codes[0], codes[1], tok_cfg


def read_tokenizers(folder: Path, src_lang: str, tgt_lang: str) -> dict[str, Any]:
    """Each language's `MarianTokenizer`, read from the folder's own files, so that a damaged
    one is named there: the tokenizer's own messages are written for a run directory's copy."""
    from nmt.data.tokenizer import MarianTokenizer

    path = folder / "vocab.json"
    ids = list(read_json_object(path, "a vocabulary").values())
    if not all(type(i) is int for i in ids) or sorted(ids) != list(range(len(ids))):
        raise NmtError(f"{path} must map pieces to the ids 0..N-1, each once; {DAMAGED}")
    tokenizers = {}
    for lang, name in ((src_lang, "source.spm"), (tgt_lang, "target.spm")):
        try:
            tokenizers[lang] = MarianTokenizer(folder / name, num_threads=1)
        except (RuntimeError, OSError) as e:  # sentencepiece's errors for a damaged model
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise NmtError(f"cannot read {folder / name} as a SentencePiece model ({reason}); {DAMAGED}") from None
    return tokenizers


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _refuse_used(root: Path) -> None:
    """An import makes a new run directory: one that holds anything is never touched."""
    if root.exists() and any(root.iterdir()):
        raise NmtError(f"--run-dir {root} already holds files; import into a new --run-dir")


def import_hf_marian(folder: str | os.PathLike, run_dir: str | os.PathLike, source_lang: Optional[str] = None,
                     target_lang: Optional[str] = None, max_positions: Optional[int] = None,
                     progress: Callable[[str], None] = lambda message: None) -> ImportResult:
    """Write a new run directory `run_dir` from the Marian model in `folder`.

    Every file of `folder` is read and checked first, so a refusal names the folder's own file
    and writes nothing. Then, holding the run directory's lock (`nmt.run.lock`), the run is
    written in preprocess's staging folder beside `run_dir` (`nmt.preprocess.staging`) and
    renamed into place: a refusal or a crash leaves no half-written run directory, of two
    imports into one run directory one is refused in one line, the staging folders of a killed
    import or preprocess are removed, and an existing, non-empty `run_dir` is never touched."""
    from nmt.data.token_arrays import token_dtype
    from nmt.model.transformer import Transformer, count_parameters
    from nmt.preprocess.staging import remove_leftover_staging, staging_dir
    from nmt.run.atomic import fsync_directory
    from nmt.run.checkpoint import save_checkpoint
    from nmt.run.directory import check_run_dir_path
    from nmt.run.identity import IDENTITY_KEY, run_identity, vocab_hashes
    from nmt.run.lock import RunLock, command_line, refuse_if_held

    folder, root = Path(folder), Path(run_dir)
    if not folder.is_dir():
        raise NmtError(f"--from hf-marian {folder}: no such folder; give a local MarianMTModel folder "
                       f"(nmt downloads nothing)")
    check_run_dir_path(root)
    _refuse_used(root)
    refuse_if_held(root)  # before the slow reading below
    marian = read_marian_config(folder)
    for name in TOKENIZER_FILES:
        if not (folder / name).is_file():
            raise NmtError(f"{folder} has no {name}; a Marian model folder holds {', '.join(TOKENIZER_FILES)}")
    src_lang, tgt_lang, _ = languages(folder, source_lang, target_lang)
    if src_lang == tgt_lang:
        raise NmtError(f"source and target language are both {src_lang!r}; pass --source-lang and --target-lang")
    tokenizers = read_tokenizers(folder, src_lang, tgt_lang)
    tok = tokenizers[tgt_lang]
    progress(f"reading the weights of {folder}")
    hf_state, weights_path = load_marian_weights(folder)
    cfg = transformer_config(marian, tok.vocab_size, tok.special_ids, hf_state, max_positions)
    weights = nmt_state_dict(hf_state, cfg, weights_path)
    del hf_state
    model = Transformer(cfg)  # of the shapes just checked: no bigger than the weight file
    model.load_state_dict(weights)
    del weights
    origin = {"from": "hf-marian", "folder": str(folder.absolute()), "weights": weights_path.name,
              "weights_sha256": _sha256(weights_path), "config": {k: marian[k] for k in MARIAN_DEFAULTS}}

    root.absolute().parent.mkdir(parents=True, exist_ok=True)  # where the lock and the staging folder live
    with suppress(OSError):
        root.rmdir()  # an empty run directory: the rename below makes it again
    with RunLock(root, command_line()):
        for leftover in remove_leftover_staging(root):
            progress(f"removed {leftover}, left by an interrupted import or preprocess")
        _refuse_used(root)
        with staging_dir(root) as stage:
            (stage / "vocab").mkdir()
            for name in TOKENIZER_FILES:
                shutil.copyfile(folder / name, stage / "vocab" / name)
            vocab = {src_lang: "vocab/source.spm", tgt_lang: "vocab/target.spm"}
            record = {
                "source_lang": src_lang, "target_lang": tgt_lang, "vocab_type": "marian", "joined": True,
                "vocab": vocab, "vocab_sizes": {lang: t.vocab_size for lang, t in tokenizers.items()},
                "vocab_sha256": vocab_hashes(stage, vocab), "dtype": token_dtype(tok.vocab_size).name,
                "moses": False, "special_ids": tok.special_ids._asdict(), "normalization": MARIAN_NORMALIZATION,
                "splits": {}, "imported": origin,
            }
            (stage / "config").mkdir()
            RunDir(stage).write_record("preprocess", record)
            (stage / "checkpoints").mkdir()
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            save_checkpoint(stage / "checkpoints" / "checkpoint_last.pt",
                            {"model": state, "config": cfg.to_dict(), IDENTITY_KEY: run_identity(RunDir(stage)),
                             "imported": origin})
            del state
            os.rename(stage, root)
            fsync_directory(root.absolute().parent)  # the new run directory's name is on disk
    return ImportResult(root, cfg, count_parameters(model), src_lang, tgt_lang)
