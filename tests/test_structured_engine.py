"""Constrained decoding in the engine (real model): schemas hold in a continuous batch beside
unconstrained rows, for greedy and sampled rows and n>1 siblings; bad schemas fail at submission."""

from __future__ import annotations

import json

import pytest
from jsonschema import Draft202012Validator

from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.errors import InvalidRequestError
from tests.engine_helpers import assert_no_leaks, chat_ids, make_engine, run_to_completion, text, token_ids

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
COLOURS = {
    "type": "object",
    "properties": {
        "colours": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["colours", "ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return make_engine()


@pytest.fixture(autouse=True)
def no_leaks(engine: LLMEngine):
    yield
    assert_no_leaks(engine)


def test_schemas_hold_in_a_mixed_batch(engine: LLMEngine) -> None:
    free = SamplingParams(max_tokens=8, temperature=0)
    person = SamplingParams(max_tokens=48, temperature=0, guided_json=json.dumps(PERSON))
    colours = SamplingParams(max_tokens=48, temperature=0.8, seed=3, n=2, guided_json=json.dumps(COLOURS))
    obj = SamplingParams(max_tokens=16, temperature=0, guided_json_object=True)
    arrivals = {
        0: [("free", chat_ids("Tell me about cats."), free), ("person", chat_ids("Describe Ada, 36, as JSON."), person)],
        2: [("colours", chat_ids("Pick some colours as JSON."), colours)],
        3: [("obj", chat_ids("Give me a JSON object about dogs."), obj)],
    }
    outs = run_to_completion(engine, arrivals)
    Draft202012Validator(PERSON).validate(json.loads(text(outs["person"])))
    for index in (0, 1):
        Draft202012Validator(COLOURS).validate(json.loads(text(outs["colours"], index)))
    assert text(outs["obj"]).startswith("{")  # any object: this small model nests until max_tokens
    finals = {rid: [d.finish_reason for o in out for d in o.deltas if d.finish_reason] for rid, out in outs.items()}
    assert finals["person"] == ["stop"] and finals["colours"] == ["stop", "stop"]
    assert len(token_ids(outs["free"])) == 8  # the unconstrained row is untouched


def test_unconstrained_greedy_is_unchanged_by_a_guided_neighbour(engine: LLMEngine) -> None:
    free = SamplingParams(max_tokens=12, temperature=0)
    alone = token_ids(run_to_completion(engine, {0: [("a", chat_ids("Name a fruit."), free)]})["a"])
    guided = SamplingParams(max_tokens=12, temperature=0, guided_json_object=True)
    both = run_to_completion(engine, {0: [("b", chat_ids("Name a fruit."), free), ("g", chat_ids("JSON please"), guided)]})
    assert token_ids(both["b"]) == alone


def test_lark_grammar(engine: LLMEngine) -> None:
    schema = json.dumps(
        {
            "type": "object",
            "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": ["x"],
            "additionalProperties": False,
            "x-guidance": {"whitespace_flexible": False},
        }
    )
    grammar = f'start: "<tool_call>" call "</tool_call>"\ncall: %json {schema}'
    params = SamplingParams(max_tokens=40, temperature=0, guided_grammar=grammar)
    out = text(run_to_completion(engine, {0: [("g", chat_ids("Call it."), params)]})["g"])
    assert out.startswith("<tool_call>") and out.endswith("</tool_call>")
    assert isinstance(json.loads(out.removeprefix("<tool_call>").removesuffix("</tool_call>"))["x"], int)


@pytest.mark.parametrize(
    ("schema", "feature"),
    [({"type": "object", "not": {"required": ["a"]}}, "not"), ({"if": {"type": "string"}, "then": {"minLength": 2}}, "if")],
)
def test_unsupported_schema_features_are_named(engine: LLMEngine, schema: dict, feature: str) -> None:
    params = SamplingParams(max_tokens=8, guided_json=json.dumps(schema))
    with pytest.raises(InvalidRequestError, match=feature):
        engine.add_request("bad", chat_ids("x"), params)
    assert "bad" not in engine.requests


def test_compiled_grammars_are_cached(engine: LLMEngine) -> None:
    params = SamplingParams(max_tokens=4, guided_json=json.dumps(PERSON))
    before = engine.grammars.compiles
    engine.grammars.validate(params)
    engine.grammars.validate(params)
    assert engine.grammars.compiles - before <= 1


def test_grammar_completion_ends_the_output_even_before_min_tokens(engine: LLMEngine) -> None:
    params = SamplingParams(max_tokens=48, min_tokens=40, temperature=0, guided_json=json.dumps(PERSON))
    outs = run_to_completion(engine, {0: [("m", chat_ids("Describe Bob, 40, as JSON."), params)]})["m"]
    Draft202012Validator(PERSON).validate(json.loads(text(outs)))
    assert [d.finish_reason for o in outs for d in o.deltas if d.finish_reason] == ["stop"]
