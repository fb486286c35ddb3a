"""What the ``seer`` commands share: the model layer, the generation and policy options, and how
the calibrate commands read their requests.

Model loading, tokenizers and images come from the model layer through the ``seer.models``
entry point (``model_adapters.services``); ``seer_runtime`` never imports a model definition.

A checkpoint directory may carry its decoding defaults in :data:`GENERATION_FILE` (the fields
of a ``GenerationConfig``, as ``GenerationConfig.to_json`` writes them; named apart from
Hugging Face's ``generation_config.json``, whose keys are not ours). The commands and the
harness adapters start from it: the library's defaults, then the checkpoint's file, then
``--gen-json``, then the options given.
"""

from __future__ import annotations

import argparse
from importlib.metadata import entry_points
from pathlib import Path

import torch

from ..config import GenerationConfig, read_json_object
from ..dyllm import DyLLMConfig
from ..evaluate import requests_from_lines
from ..request_files import CALIBRATION_REQUEST, TEXT_CALIBRATION_REQUEST, read_jsonl
from ..seer import SeerConfig
from .progress import CommandProgress

#: the embedded models ``--workload`` names (the model layer's ``embedded(workload)`` serves each);
#: ``--model`` takes the same names (and ``embedded``, the demo model's directory name)
EMBEDDED_WORKLOADS = ("demo", "arith")
EMBEDDED_ALIASES = {"embedded": "demo"}

#: --dtype choices -> torch dtypes (None: the checkpoint's own)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, None: None}
#: a checkpoint directory's decoding defaults (GenerationConfig fields)
GENERATION_FILE = "seer_generation_config.json"


def model_services():
    """The registered model layer (``model_adapters.services`` unless another package registers)."""
    found = list(entry_points(group="seer.models"))
    if not found:
        raise RuntimeError("no 'seer.models' entry point is installed: run `pip install -e .` in the repository")
    chosen = next((e for e in found if e.name == "default"), found[0])
    return chosen.load()


def progress_of(args) -> CommandProgress:
    """The command's :class:`~.progress.CommandProgress` (``main`` sets one; made here otherwise)."""
    if getattr(args, "progress", None) is None:
        args.progress = CommandProgress()
    return args.progress


def non_empty_text(text: str) -> str:
    """argparse type: a string that is not empty or only whitespace (a prompt)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must not be empty or only whitespace, got {text!r}")
    return text


def path_text(text: str) -> str:
    """argparse type: a file or directory path, not empty (``--data ""`` must not fall back to a
    default silently)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a path, got {text!r}")
    return text


def embedded_model_dir(name: str) -> Path | None:
    """The directory of the embedded model ``name`` names (``demo`` or ``embedded``, ``arith``), None
    for any other name."""
    workload = EMBEDDED_ALIASES.get(name, name)
    if workload not in EMBEDDED_WORKLOADS:
        return None
    return Path(model_services().embedded(workload).MODEL_DIR)


def model_path(text: str) -> str:
    """argparse type of ``--model``: a checkpoint directory, or an embedded model by name (``demo``
    - also ``embedded`` - or ``arith``: the ``--workload`` names) from any working directory; a
    directory of that name in the working directory wins over the embedded model."""
    text = path_text(text)
    if not Path(text).exists():
        found = embedded_model_dir(text.strip())
        if found is not None:
            return str(found)
    return text


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` with each option's default after its help, unless the option is a flag, its default
    is None (no value of its own: the help says what happens without it) or the help states it."""

    def _get_help_string(self, action):
        text = action.help or ""
        flag = isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._VersionAction))
        if (flag or not action.option_strings or action.default in (None, argparse.SUPPRESS)
                or "%(default)" in text or "default" in text):
            return text
        return text + " (default: %(default)s)"


def positive_int(text: str) -> int:
    """argparse type: an int >= 1 (anything else exits with status 2, naming the option)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {value}")
    return value


def device_name(text: str) -> str:
    """argparse type: a torch device string whose device this machine has."""
    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"expected a device such as cpu, cuda or cuda:1, got {text!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text!r}: this machine has no CUDA device (torch.cuda.is_available() "
                                         "is False)")
    return text


def add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", default=None, choices=[k for k in DTYPES if k],
                   help="the weights' dtype once loaded (default: the checkpoint's own; the embedded models: float32)")
    p.add_argument("--device", default="cpu", type=device_name, help="where the model runs: cpu, cuda, cuda:1, ...")
    p.add_argument("--chat-template", default=None, type=path_text,
                   help="the prompt template, instead of the checkpoint's own (its chat_template.jinja, or the "
                        "chat_template of its tokenizer_config.json): a jinja2 file, or a family template by name "
                        "(llada, dream, lavida-llada, lavida-dream)")


def checkpoint_generation_fields(path: str | Path) -> dict:
    """The GenerationConfig fields stored in ``path``/:data:`GENERATION_FILE` ({} without one);
    validated (an unknown field or a bad value is a ``ValueError`` naming the file)."""
    file = Path(path) / GENERATION_FILE
    if not file.is_file():
        return {}
    fields = read_json_object(file, "the checkpoint's decoding defaults")
    try:
        GenerationConfig.from_dict(fields)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{file}: {exc}") from None
    return fields


def add_generation_options(p: argparse.ArgumentParser, *, with_policies: bool = True) -> None:
    g = p.add_argument_group("generation", f"GenerationConfig fields; each defaults to the checkpoint's "
                                           f"{GENERATION_FILE}, then --gen-json, then the library's default")
    g.add_argument("--gen-length", type=int, default=None,
                   help="response window in positions (default: the checkpoint's, else 128; the embedded models: "
                        "demo 32, arith 128)")
    g.add_argument("--steps", type=int, default=None,
                   help="denoising steps (default: the checkpoint's, else gen_length)")
    g.add_argument("--block-length", type=int, default=None,
                   help="semi-autoregressive block, LLaDA family (default: the checkpoint's, else gen_length)")
    g.add_argument("--temperature", type=float, default=None, help="0 = argmax (default: the checkpoint's, else 0)")
    g.add_argument("--remasking", default=None,
                   help="LLaDA family: low_confidence|random|margin|entropy (default: the checkpoint's, else "
                        "low_confidence)")
    g.add_argument("--alg", default=None,
                   help="Dream family: origin|maskgit_plus|topk_margin|entropy (default: the checkpoint's, else "
                        "origin)")
    g.add_argument("--cfg-scale", type=float, default=None,
                   help="classifier-free guidance scale, LLaDA family (default: the checkpoint's, else 0: none)")
    g.add_argument("--schedule", default=None,
                   help="LaViDa: shift|cosine|logit_normal|uniform (default: the checkpoint's, else the family's "
                        "linear rule)")
    g.add_argument("--step-ratio", type=float, default=None,
                   help="LaViDa: steps per block scaled by this ratio (0, 1] (default: the checkpoint's, else none)")
    g.add_argument("--prefix-cache", dest="prefix_cache", action="store_true", default=None,
                   help="compute the prompt's K/V once and reuse it every step (default: the checkpoint's setting; "
                        "on for LaViDa models)")
    g.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false",
                   help="feed the prompt to every forward (the reference generators' way)")
    g.add_argument("--threshold", type=float, default=None,
                   help="confidence-threshold parallel decoding (0, 1], e.g. 0.9 (Fast-dLLM's): the step count "
                        "follows the model (default: off, a fixed count per step)")
    g.add_argument("--block-cache", default=None, choices=["prefix", "dual"],
                   help="Fast-dLLM's block K/V cache, LLaDA family (default: none)")
    g.add_argument("--early-stop", dest="early_stop", action="store_true", default=None,
                   help="end a request on the step that commits its end token with every earlier position "
                        "committed (its answer unchanged; default: every planned step runs)")
    g.add_argument("--gen-json", default=None, type=path_text,
                   help="a JSON file of GenerationConfig fields, over the checkpoint's and under the options given")
    if not with_policies:
        return
    g.add_argument("--seer", default=None, type=path_text,
                   help="a SeerConfig JSON file (from `seer calibrate`; the embedded models ship theirs as "
                        "seer_config.json) to cut the window at step 0 (default: no cut)")
    g.add_argument("--dyllm", default=None, type=path_text,
                   help="a DyLLMConfig JSON file (from `seer calibrate-dyllm`; the embedded models ship theirs as "
                        "dyllm_config.json), or 'default' (the authors' settings: the family's tau, 4 dense warm-up "
                        "steps, the prompt fed every 4th step, their partial attention) (default: off)")


def generation_config(args, checkpoint: str | Path | None = None) -> GenerationConfig:
    """The checkpoint's decoding defaults (:data:`GENERATION_FILE`), ``--gen-json`` over them,
    and the command-line options over both."""
    fields = checkpoint_generation_fields(checkpoint) if checkpoint is not None else {}
    if args.gen_json:
        fields.update(read_json_object(args.gen_json, "--gen-json"))
    if args.threshold is not None and args.steps is None:
        fields.pop("steps", None)  # a threshold decides the steps: the checkpoint's count is not used
    for name in ("gen_length", "steps", "block_length", "temperature", "remasking", "alg", "cfg_scale", "schedule",
                 "step_ratio", "prefix_cache", "threshold", "block_cache", "early_stop"):
        value = getattr(args, name)
        if value is not None:
            fields[name] = value
    return GenerationConfig.from_dict(fields)


def policy_files(args) -> tuple[SeerConfig | None, DyLLMConfig | str | None]:
    """The Seer and DyLLM configurations the files of ``--seer`` / ``--dyllm`` hold, read before
    any model is loaded (``--dyllm default`` stays the string "default": it needs the model)."""
    seer = SeerConfig.from_json(args.seer) if getattr(args, "seer", None) else None
    dyllm = getattr(args, "dyllm", None) or None
    if dyllm is not None and dyllm != "default":
        dyllm = DyLLMConfig.from_json(dyllm)
    return seer, dyllm


def policies(args, model, files: tuple | None = None) -> tuple[SeerConfig | None, DyLLMConfig | None]:
    """The Seer and DyLLM configurations named by ``--seer`` / ``--dyllm`` (``files``: what
    :func:`policy_files` read before the model was loaded)."""
    seer, dyllm = files if files is not None else policy_files(args)
    if dyllm == "default":
        dyllm = DyLLMConfig.for_model(model)
    return seer, dyllm


def add_calibration_inputs(p: argparse.ArgumentParser) -> None:
    """The options both calibrate commands read their requests with (:func:`load_calibration_inputs`)."""
    p.add_argument("--model", default=None, type=model_path,
                   help="a local checkpoint with its tokenizer.json, or an embedded model by name (demo, arith); "
                        "needs --data (default: the embedded model --workload names, with its calibration split)")
    p.add_argument("--workload", default=None, choices=EMBEDDED_WORKLOADS,
                   help="without --model: which embedded model and calibration split (default: demo); "
                        "an error with --model")
    p.add_argument("--data", default=None, type=path_text,
                   help="JSONL, one request per line: question, optional image (path relative to the file), "
                        "optional answer (default: the embedded model's calibration split)")
    p.add_argument("--requests", type=positive_int, default=None, help="use only the first N requests of the data")
    add_model_options(p)
    add_generation_options(p, with_policies=False)


def load_calibration_inputs(args):
    """(model, requests, generation config, score) from the calibrate commands' options:
    ``--model`` with ``--data`` (a real checkpoint, its tokenizer and generation options; score
    None: exact match), or the embedded model ``--workload`` names with its calibration split (or
    ``--data``) and its own score (``answer_figures``: the final answer on ``arith``).

    Everything that can be checked without the model is checked first: the options that do not
    apply (``--workload`` with ``--model``, ``--chat-template`` without it), the checkpoint's
    config.json, its template, every line of ``--data`` (``request_files``) with its prompt,
    answer and image file; only then is the model loaded."""
    svc = model_services()
    progress = progress_of(args)
    if args.model:  # a real checkpoint: its own tokenizer, image processor and generation options
        if args.workload is not None:
            raise ValueError(f"--workload {args.workload} picks an embedded model; it does not apply with --model "
                             f"{args.model} (drop one of them)")
        if not args.data:
            raise ValueError("--model needs --data (a JSONL of requests: question, optional image and answer)")
        checkpoint = svc.check_checkpoint(args.model)
        tok = svc.load_tokenizer(args.model, chat_template=args.chat_template)
        gen = generation_config(args, args.model)
        schema = CALIBRATION_REQUEST if checkpoint["multimodal"] else TEXT_CALIBRATION_REQUEST
        lines = read_jsonl(args.data, schema, what="--data")[: args.requests]
        requests = requests_from_lines(lines, args.data, encode_prompt=tok.encode_prompt, encode_answer=tok.encode,
                                       load_image=lambda path: svc.open_image(path, what="image file"))
        progress.stage = "loading the model"
        model = svc.load_model(args.model, dtype=DTYPES[args.dtype], device=args.device)
        for request in requests:
            if request.image is not None:
                request.image = svc.prepare_image(model, request.image)
        return model, requests, gen, None
    if args.chat_template:
        raise ValueError("--chat-template needs --model (the embedded model's prompts use its own template)")
    emb = svc.embedded(args.workload or "demo")
    gen = generation_config(args, emb.MODEL_DIR)  # the model's decoding defaults, the options given over them
    requests, _ = emb.calibration_requests(args.data, n=args.requests)
    progress.stage = "loading the model"
    model, tokenizer = emb.load_embedded(dtype=DTYPES[args.dtype], device=args.device)
    return model, requests, gen, lambda reqs, answers: emb.answer_figures(reqs, answers, tokenizer)["exact_match"]
