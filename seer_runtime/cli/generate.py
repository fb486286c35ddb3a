"""``seer generate``: decode one prompt with a local checkpoint and print the answer and the statistics.

The prompt is the checkpoint's own chat template rendered for one user turn (``--chat-template``
names another), and decoding starts from the checkpoint's defaults (``options.GENERATION_FILE``)
with the options given over them: so the embedded model answers here as it does in ``seer demo``.
Nothing is written but the answer (stdout) and the statistics (stderr).
"""

from __future__ import annotations

import argparse
import sys

import torch

from ..generation import generate
from .options import (
    DTYPES,
    add_generation_options,
    add_model_options,
    generation_config,
    model_services,
    non_empty_text,
    path_text,
    policies,
    policy_files,
    progress_of,
)


def add_parsers(sub) -> None:
    p = sub.add_parser("generate", help="decode one prompt with a local checkpoint")
    p.add_argument("--model", required=True, type=path_text,
                   help="a local Hugging Face directory (config.json + safetensors)")
    p.add_argument("--prompt", required=True, type=non_empty_text, help="the user's turn (not empty)")
    p.add_argument("--image", default=None, type=path_text, help="an image file (LaViDa models)")
    add_model_options(p)
    add_generation_options(p)
    p.set_defaults(func=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    """Everything the model is not needed for is checked before it is loaded: the checkpoint's
    config.json, ``--image`` on a text-only checkpoint and the image file, the chat template and
    the prompt it renders, the generation options and the ``--seer`` / ``--dyllm`` files."""
    svc = model_services()
    progress = progress_of(args)
    progress.stage = "reading the checkpoint"
    checkpoint = svc.check_checkpoint(args.model)
    if args.image and not checkpoint["multimodal"]:
        raise ValueError(f"--image was given, but {args.model} holds a text-only model ({checkpoint['architecture']})")
    tok = svc.load_tokenizer(args.model, chat_template=args.chat_template)
    gen = generation_config(args, args.model)
    prompt_ids = tok.encode_prompt(args.prompt, with_image=bool(args.image))
    files = policy_files(args)
    picture = svc.open_image(args.image, what="--image") if args.image else None
    progress.stage = "loading the model"
    model = svc.load_model(args.model, dtype=DTYPES[args.dtype], device=args.device)
    images = [svc.prepare_image(model, picture)] if picture is not None else None
    ids = torch.tensor([prompt_ids], device=model.device)
    seer, dyllm = policies(args, model, files)
    progress.start(1)
    out = generate(model, ids, images=images, gen=gen, seer=seer, dyllm=dyllm, progress=True)
    progress.advance(1)
    print(tok.decode(out.answer_ids(0)))
    st = out.stats
    print(f"\n[stats] NFE {st.nfe}  steps {st.steps[0]}  positions computed (x layers) {st.positions_computed:,}  "
          + "  ".join(f"{k} {v:.3f}s" for k, v in st.time_s.items()), file=sys.stderr)
    print(f"[stats] chat template: {tok.template.source}; window {gen.gen_length}, block {gen.block}",
          file=sys.stderr)
    for key, value in st.extra.items():
        print(f"[stats] {key}: {value}", file=sys.stderr)
    return 0
