"""The lazy grammar of `auto` tool choice, per format: it takes the family's recorded answers (free
text, then calls that fit the tools), and refuses a call of a tool the request lacks or with an argument
its schema refuses. And what the parsers ask of a request's sampling: the grammar only where nothing
else shapes the output, special tokens kept where a format is written in them."""

import pytest
import xgrammar as xgr
from xgrammar.testing import _is_grammar_accept_string as accepts

from core.sampling_params import SamplingParams
from core.structured_output import StructuredOutput
from openai_serve.parsers.selection import OutputParsing
from openai_serve.protocol.fields import Fields
from openai_serve.protocol.tools import read_tools
from tests.parsers.cases import FAMILIES, TOOLS, Family

GRAMMAR_FAMILIES = [pytest.param(family, id=family.tool_call_parser) for family in FAMILIES]


def parsing(tool_call_parser: str | None, reasoning_parser: str | None = None, **request: object) -> OutputParsing:
    tools = read_tools(Fields({"tools": TOOLS, **request}))
    return OutputParsing(tools, tool_call_parser, reasoning_parser, "")


def grammar_of(family: Family) -> xgr.Grammar:
    constraint = parsing(family.tool_call_parser).sampling(SamplingParams()).structured_output
    assert constraint is not None and constraint.structural_tag is not None and constraint.param == "tools"
    return xgr.Grammar.from_structural_tag(constraint.structural_tag)


@pytest.mark.parametrize("family", GRAMMAR_FAMILIES)
def test_the_grammar_takes_the_familys_answers(family: Family) -> None:
    grammar = grammar_of(family)
    for case in family.cases:
        if "malformed" not in case.name:
            assert accepts(grammar, case.text), case.name


@pytest.mark.parametrize("family", GRAMMAR_FAMILIES)
def test_the_grammar_refuses_calls_the_tools_do_not_allow(family: Family) -> None:
    grammar = grammar_of(family)
    one_call = next(case.text for case in family.cases if case.name == "one call")
    assert accepts(grammar, one_call)
    assert not accepts(grammar, one_call.replace("get_weather", "get_stock"))  # no such tool
    what, instead = family.wrong_type
    assert what in one_call and not accepts(grammar, one_call.replace(what, instead))  # days is an integer


def test_without_parallel_calls_the_grammar_stops_after_one() -> None:
    family = next(f for f in FAMILIES if f.tool_call_parser == "hermes")
    two_calls = next(case.text for case in family.cases if case.name == "parallel calls")
    constraint = parsing("hermes", parallel_tool_calls=False).sampling(SamplingParams()).structured_output
    assert constraint is not None
    single = xgr.Grammar.from_structural_tag(constraint.structural_tag)
    assert accepts(grammar_of(family), two_calls) and not accepts(single, two_calls)


def test_the_grammar_stays_off_where_the_request_shapes_its_output_otherwise() -> None:
    auto = parsing("hermes")
    schema = StructuredOutput(json_object=True)
    assert auto.sampling(SamplingParams(structured_output=schema)).structured_output == schema
    assert auto.sampling(SamplingParams(min_tokens=3)).structured_output is None
    assert auto.sampling(SamplingParams(ignore_eos=True)).structured_output is None
    assert parsing("hermes", tool_choice="none").sampling(SamplingParams()).structured_output is None
    assert parsing(None).sampling(SamplingParams()) == SamplingParams()


def test_a_schema_the_grammar_engine_refuses_leaves_the_calls_unconstrained() -> None:
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "string", "pattern": "(unclosed"}}}}}
    tools = read_tools(Fields({"tools": [bad]}))
    assert OutputParsing(tools, "hermes", None, "").sampling(SamplingParams()).structured_output is None


@pytest.mark.parametrize(("tool_call_parser", "reasoning_parser", "keeps"), [
    ("hermes", None, False), ("qwen3_coder", "qwen3", False), ("mistral", None, True), ("kimi_k2", None, True),
    ("harmony", None, True), (None, "harmony", True), (None, "mistral", True), ("deepseek_v31", None, True),
])
def test_special_tokens_are_kept_where_a_format_is_written_in_them(
    tool_call_parser: str | None, reasoning_parser: str | None, keeps: bool
) -> None:
    sampling = parsing(tool_call_parser, reasoning_parser).sampling(SamplingParams())
    assert sampling.skip_special_tokens is not keeps
    forced = parsing(tool_call_parser, reasoning_parser, tool_choice="required")
    assert forced.sampling(SamplingParams()).skip_special_tokens  # a forced answer is JSON: nothing to keep


def test_the_grammar_compiles_against_a_real_vocabulary(smollm2_dir: object) -> None:
    """What the engine does with it: compiled for the model's tokenizer, a matcher that takes a call's tokens."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    info = xgr.TokenizerInfo.from_huggingface(tokenizer)
    constraint = parsing("hermes").sampling(SamplingParams()).structured_output
    compiled = xgr.GrammarCompiler(info).compile_grammar(xgr.Grammar.from_structural_tag(constraint.structural_tag))  # type: ignore[union-attr]
    text = 'Sure. <tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call> Done.'
    matcher = xgr.GrammarMatcher(compiled)
    assert all(matcher.accept_token(token) for token in tokenizer.encode(text)) and matcher.is_terminated() is False
    assert matcher.accept_token(tokenizer.eos_token_id) and matcher.is_terminated()  # free text may end anywhere
    matcher = xgr.GrammarMatcher(compiled)
    assert not all(matcher.accept_token(token) for token in tokenizer.encode(text.replace("get_time", "get_stock")))
