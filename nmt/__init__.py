"""nmt: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a toolkit."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence, Union

if TYPE_CHECKING:  # `import nmt` stays cheap: torch loads with the first nmt.load()
    from nmt.api import Model

__version__ = "0.1.0"
__all__ = ["load", "__version__"]


def load(run_dir: Union[str, Path], checkpoint: Union[None, str, Path, Sequence[Union[str, Path]]] = None,
         **settings: Any) -> "Model":
    """Load a trained run for translating from Python, as `nmt translate -r RUN_DIR` would.

    `checkpoint`: a file or a name in RUN_DIR/checkpoints, or a list of them to ensemble; by
    default checkpoint_avg.pt, else checkpoint_best.pt, else checkpoint_last.pt. `settings`
    are the flags of `nmt translate` as keywords (device="cpu", threads=2, amp="bf16",
    beam=4, lenpen=0.6, ...); beam search settings can also be changed per call.

    >>> import nmt
    >>> model = nmt.load("runs/multi30k-en-de", device="cpu")
    >>> german = model.translate(["A man rides a bike.", "", "Two dogs play in the snow."], beam=4)
    >>> len(german), german[1]
    (3, '')
    >>> model.translate("A man rides a bike.", beam=4) == german[0]
    True
    >>> best = model.translate_nbest("A man rides a bike.", beam=4, nbest=2)
    >>> best.hyp == german[0], len(best.nbest), best.nbest[0][1] >= best.nbest[1][1]
    (True, 2, True)
    >>> model.translate(42)
    Traceback (most recent call last):
    TypeError: translate takes a str or a list of str, not int
    """
    from nmt.api import load as load_model

    return load_model(run_dir, checkpoint, **settings)
