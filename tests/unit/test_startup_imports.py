"""What a start imports, and when: the server's process starts the engine's before it imports torch, transformers or
the app (the two processes then import at once), `core`'s names import at first use, and the engine's process
does not import transformers' model-loading stack for the encoder families. Each case runs in a fresh interpreter,
whose modules are its own."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "xgrammar", "uvicorn", "openai_serve.app")  # starlette is light: the settings use it


def modules_after(code: str) -> dict[str, object]:
    """Runs `code` in a fresh interpreter, which sets `result` (JSON values); returns it."""
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", f"{code}\nimport json\nprint(json.dumps(result))"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_server_starts_the_engine_before_it_imports_torch_or_the_http_side(tiny_qwen3_dir: Path) -> None:
    result = modules_after(f"""
import sys
import openai_serve.cli as cli
from core.engine_process import EngineProcess
result = {{"at_import": [m for m in {HEAVY!r} if m in sys.modules]}}
def spawned(config, **options):
    result["at_spawn"] = [m for m in {HEAVY!r} if m in sys.modules]
    result["model"] = config.model.model
    raise RuntimeError("no engine here")
EngineProcess.spawned = spawned
try:
    cli.main(["--model", {str(tiny_qwen3_dir)!r}, "--device", "cpu"])
except SystemExit as exc:
    result["exit"] = str(exc)
""")
    assert result == {"at_import": [], "at_spawn": [], "model": str(tiny_qwen3_dir),
                      "exit": "openai-serve: no engine here"}


def test_the_server_without_an_engine_process_builds_the_engine_in_its_own(tiny_qwen3_dir: Path) -> None:
    result = modules_after(f"""
from openai_serve.cli import parse_settings, start_engine
engine = start_engine(parse_settings(["--model", {str(tiny_qwen3_dir)!r}, "--device", "cpu", "--no-engine-process",
                                      "--kv-cache-blocks", "16"]))()
result = type(engine).__name__
""")
    assert result == "LLMEngine"


def test_core_imports_its_names_at_first_use() -> None:
    result = modules_after("""
import sys
import core
before = "core.engine" in sys.modules or "torch" in sys.modules
from core import SamplingParams, grammar
result = [before, "core.engine" in sys.modules, SamplingParams.__module__, grammar.__name__]
from core import LLMEngine
result.append(LLMEngine.__module__)
try:
    core.Nothing
except AttributeError as exc:
    result.append(str(exc))
""")
    assert result == [False, False, "core.sampling_params", "core.grammar", "core.engine",
                      "module 'core' has no attribute 'Nothing'"]


def test_the_engine_does_not_import_transformers_model_loading_stack() -> None:
    result = modules_after("""
import sys
import core.engine, gpu.models
result = [m for m in ("transformers.activations", "transformers.core_model_loading", "accelerate") if m in sys.modules]
""")
    assert result == []
