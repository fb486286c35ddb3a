"""``seer generate``: decode one prompt with a local checkpoint and print the answer and the statistics.

The prompt is the checkpoint's own chat template rendered for one user turn (``--chat-template``
names another), and decoding starts from the checkpoint's defaults (``options.GENERATION_FILE``)
with the options given over them: so the embedded model answers here as it does in ``seer demo``.
"""

from __future__ import annotations

import argparse
import sys

import torch

from ..generation import generate
from .options import DTYPES, add_generation_options, add_model_options, generation_config, model_services, policies


def add_parsers(sub) -> None:
    p = sub.add_parser("generate", help="decode one prompt with a local checkpoint")
    p.add_argument("--model", required=True, help="a local Hugging Face directory (config.json + safetensors)")
    p.add_argument("--prompt", required=True)
    p.add_argument("--image", default=None, help="an image file (LaViDa models)")
    add_model_options(p)
    add_generation_options(p)
    p.set_defaults(func=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    svc = model_services()
    tok = svc.load_tokenizer(args.model, chat_template=args.chat_template)
    gen = generation_config(args, args.model)
    model = svc.load_model(args.model, dtype=DTYPES[args.dtype], device=args.device)
    images = [svc.load_image(model, args.image)] if args.image else None
    ids = torch.tensor([tok.encode_prompt(args.prompt, with_image=bool(args.image))], device=model.device)
    seer, dyllm = policies(args, model)
    out = generate(model, ids, images=images, gen=gen, seer=seer, dyllm=dyllm, progress=True)
    print(tok.decode(out.answer_ids(0)))
    st = out.stats
    print(f"\n[stats] NFE {st.nfe}  steps {st.steps[0]}  tokens computed {st.tokens_computed:,}  "
          + "  ".join(f"{k} {v:.3f}s" for k, v in st.time_s.items()), file=sys.stderr)
    print(f"[stats] chat template: {tok.template.source}; window {gen.gen_length}, block {gen.block}",
          file=sys.stderr)
    for key, value in st.extra.items():
        print(f"[stats] {key}: {value}", file=sys.stderr)
    return 0
