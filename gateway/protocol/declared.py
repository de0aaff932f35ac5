"""Declared request objects: every field an endpoint accepts, with its type, default, bounds and policy.

A request body is one class (pydantic v2, strict: `"1"` is not 1 and `1` is not `true`). Each field says
what it is and how it is handled, in one place:

    user: str | None = None                                            # used
    temperature: Annotated[float | None, Field(ge=0, le=2)] = None     # used, with the API's bounds
    metadata: Annotated[dict[str, Any] | None, Hint("bookkeeping")] = None   # accepted, no effect here
    audio: Annotated[Any, Refused("this model produces text only.")] = None  # a 400 naming it

Clients such as Claude Code and Codex CLI always send hints a local model cannot act on; a hint does not
change the meaning of the answer, so it is accepted and its note says what it does here (docs/clients/fields.md
lists every one). A field that would make the answer wrong if ignored is refused. `strict_params: true`
refuses every hint too, except values that ask for nothing (`Hint(neutral=...)`).

`Declared.parse` validates a JSON body and turns the first problem into the endpoint's own 400: OpenAI's or
Anthropic's wording, and the API's `param` path (`messages[0].content`, `stream_options.include_usage`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import NoneType
from typing import Annotated, Any, ClassVar, Literal, Self, Union, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, GetCoreSchemaHandler, Tag, ValidationError
from pydantic_core import PydanticCustomError, core_schema

from gateway.errors import InvalidRequest


@dataclass(frozen=True)
class Wording:
    """An API's words for a field it does not know, for one this server does not honour, and (where the API has
    its own) for a value of the wrong type or out of bounds."""

    unknown: Callable[[str], str]
    unsupported: Callable[[str, str], str]
    invalid: Callable[[str, str], str] | None = None  # (path, pydantic's message): None for OpenAI's own sentences


OPENAI = Wording(
    unknown=lambda name: f"Unrecognized request argument supplied: {name}",
    unsupported=lambda name, why: f"'{name}' is not supported by this server: {why}",
)
# Anthropic's API speaks pydantic's sentences ("max_tokens: Input should be greater than or equal to 1")
ANTHROPIC = Wording(
    unknown=lambda name: f"{name}: Extra inputs are not permitted.",
    unsupported=lambda name, why: f"'{name}' is not supported: {why}",
    invalid=lambda name, message: f"{name}: {message}",
)
STRICT_WHY = "strict_params is on, and here it would have no effect"


def left_out(strict: bool, wording: Wording, name: str, why: str) -> None:
    """A tool the server cannot run is left out of what the model sees; under strict_params, refused."""
    if strict:
        raise InvalidRequest(wording.unsupported(name, why), param=name)


@dataclass(frozen=True)
class Hint:
    """Accepted with no effect here; `note` says why (the docs table shows it)."""

    note: str
    neutral: Callable[[Any], bool] = lambda value: False  # values that ask for nothing: kept under strict_params


@dataclass(frozen=True)
class Refused:
    """Any non-null value is a 400 naming the field: ignoring it would make the answer wrong."""

    why: str


class _OneError:
    """Any error inside the field becomes one error of the subclass's `kind`, its message `template` filled from the
    marker's own fields: the field's own words, not pydantic's per-member list."""

    kind: ClassVar[str]
    template: ClassVar[str]

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        kind, template, context = self.kind, self.template, dict(vars(self))

        def wrap(value: Any, inner: core_schema.ValidatorFunctionWrapHandler) -> Any:
            try:
                return inner(value)
            except ValidationError:
                raise PydanticCustomError(kind, template, context) from None

        return core_schema.no_info_wrap_validator_function(wrap, handler(source))


@dataclass(frozen=True)
class Expect(_OneError):
    """One type error for a field whatever went wrong inside it: `expected a string or an array of strings`
    instead of one error per member of a union."""

    kind = "expected"
    template = "expected {what}"
    what: str


@dataclass(frozen=True)
class Only(_OneError):
    """A field whose other values this server cannot honour: any invalid value is refused with `why`."""

    kind = "unsupported_value"
    template = "{why}"
    why: str


def integral(value: Any) -> Any:
    """JSON has one number type: 2.0 is the integer 2 (as the OpenAI API takes it); 2.5 stays a type error."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


Int = Annotated[int, BeforeValidator(integral)]  # a JSON integer


def tagged(*classes: type[BaseModel], other: type[BaseModel] | None = None) -> Any:
    """One of `classes`, told apart by the object's `type` (each class's `type` field is a Literal of the values it
    takes, None among them for a class the type may be left out of): only that class validates it, so an error
    inside it keeps its own path (`messages[0].content[1].text`). `other` takes any other string type; without it an
    unknown type is a 400 at `<path>.type` listing the known ones."""
    by_kind = {value: cls.__name__ for cls in classes for value in _literal_values(cls.model_fields["type"].annotation)}
    known = " or ".join(", ".join(repr(v) for v in by_kind if v is not None).rsplit(", ", 1))

    def pick(value: object) -> str | None:
        if not isinstance(value, Mapping):
            return classes[0].__name__  # its own error: "an object"
        found = value.get("type")
        if isinstance(found, str | NoneType) and found in by_kind:
            return by_kind[found]
        return other.__name__ if other is not None and isinstance(found, str) else None

    members = tuple(Annotated[cls, Tag(cls.__name__)] for cls in (*classes, *([other] if other else [])))
    return Annotated[Union[members], Discriminator(pick, custom_error_type="unknown_type", custom_error_message=known)]  # noqa: UP007


def _literal_values(annotation: Any) -> Iterator[object]:
    if annotation is NoneType:
        yield None
    elif get_origin(annotation) is Literal:
        yield from get_args(annotation)
    else:
        for arg in get_args(annotation):
            yield from _literal_values(arg)


class Declared(BaseModel):
    """A request object. Subclasses declare fields; `wording` is the API's words for an unknown field."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, protected_namespaces=())
    wording: ClassVar[Wording] = OPENAI
    _policies: ClassVar[dict[str, Hint | Refused]] = {}  # the fields that are not simply used
    _watched: ClassVar[tuple[str, ...]] = ()  # those, then the declared objects that hold some (arrays of them last)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls._policies = {name: p for name in cls.model_fields if (p := policy_of(cls, name)) is not None}
        nested = [(many, name) for name, info in cls.model_fields.items()  # objects with something to check inside
                  for sub, many in _declared_types(info.annotation) if sub._watched]
        cls._watched = (*cls._policies, *dict.fromkeys(name for _, name in sorted(nested, key=lambda n: n[0])))

    @classmethod
    def parse(cls, body: Mapping[str, Any], *, strict_params: bool = False) -> Self:
        """The validated request; a 400 (InvalidRequest) in the API's words for the first problem found."""
        try:
            obj = cls.model_validate(body)
        except ValidationError as exc:
            raise _translate(_first(exc.errors()), cls.wording) from None
        obj.check_policy(strict_params, "")
        return obj

    def check_policy(self, strict_params: bool, at: str) -> None:
        """Refused fields, and hints under strict_params, among the fields given; nested objects too."""
        cls = type(self)
        for name in cls._watched:  # in a fixed order: the first problem is the same on every run
            value = getattr(self, name)
            if value is None or name not in self.model_fields_set:
                continue
            path = f"{at}.{name}" if at else name
            policy = cls._policies.get(name)
            if isinstance(policy, Refused):
                raise InvalidRequest(self.wording.unsupported(path, policy.why), param=path)
            if isinstance(policy, Hint) and strict_params and not policy.neutral(value):
                raise InvalidRequest(self.wording.unsupported(path, f"{STRICT_WHY} ({policy.note})"), param=path)
            for i, item in _declared_items(value):
                item.check_policy(strict_params, path if i is None else f"{path}[{i}]")

    def given(self, name: str) -> bool:
        """Whether the client sent `name` with a non-null value."""
        return name in self.model_fields_set and getattr(self, name) is not None

    @classmethod
    def hints(cls, at: str = "") -> dict[str, str]:
        """Every hint of this object and of the declared objects it holds, by path: what the docs table lists."""
        out: dict[str, str] = {}
        for name, info in cls.model_fields.items():
            path = f"{at}.{name}" if at else name
            policy = policy_of(cls, name)
            if isinstance(policy, Hint):
                out[path] = policy.note
            for sub, many in _declared_types(info.annotation):
                out.update(sub.hints(f"{path}[]" if many else path))
        return out


def policy_of(cls: type[BaseModel], name: str) -> Hint | Refused | None:
    for item in cls.model_fields[name].metadata:
        if isinstance(item, Hint | Refused):
            return item
    return None


def _declared_items(value: Any) -> Iterator[tuple[int | None, Declared]]:
    if isinstance(value, Declared):
        yield None, value
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            if isinstance(item, Declared):
                yield i, item


def _declared_types(annotation: Any, many: bool = False) -> Iterator[tuple[type[Declared], bool]]:
    """The declared classes a field's type holds, each with whether it comes as an array."""
    if isinstance(annotation, type) and issubclass(annotation, Declared):
        yield annotation, many
        return
    many = many or getattr(annotation, "__origin__", None) in (list, tuple)
    for arg in getattr(annotation, "__args__", ()):
        yield from _declared_types(arg, many)


# pydantic's error types -> what the API says was expected
_EXPECTED = {
    "int_type": "an integer", "int_from_float": "an integer", "int_parsing": "an integer",
    "float_type": "a number", "float_parsing": "a number", "bool_type": "a boolean", "bool_parsing": "a boolean",
    "string_type": "a string", "dict_type": "an object", "model_type": "an object", "model_attributes_type": "an object",
    "list_type": "an array", "tuple_type": "an array",
}  # fmt: skip
_BOUND = {"greater_than_equal": ("ge", "at least"), "greater_than": ("gt", "greater than"),
          "less_than_equal": ("le", "at most"), "less_than": ("lt", "less than")}  # fmt: skip


def param_path(loc: tuple[int | str, ...]) -> str:
    """pydantic's location -> the API's parameter path: ('messages', 0, 'content') -> messages[0].content."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


_TYPE_TAGS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "a boolean", "none": "null"}


def _is_tag(part: int | str) -> bool:
    """pydantic names each member of a union in an error's location (`('input', 'str')`, `'list[any]'`,
    `'NamedToolChoice'`); field names are snake_case words, so these never collide with one."""
    return isinstance(part, str) and (part in _TYPE_TAGS or "[" in part or "-" in part or part[:1].isupper())


def _tag_phrase(tag: str) -> str:
    if tag in _TYPE_TAGS:
        return _TYPE_TAGS[tag]
    if tag.startswith(("list[", "tuple[")):
        return "an array"
    if tag.startswith("literal["):
        return tag[len("literal[") : -1].replace(",", ", ")
    return "an object"  # dict[...] or a declared class


_SHAPE = {*_EXPECTED, "expected"}  # a member of a union whose JSON type the value does not have


def _fits(error: Any, cut: int) -> bool:
    """Whether a union member's error says the value had the member's shape: the error is inside it, or about
    something other than the value's JSON type (a missing field, a bound, an unknown `type`, a literal's value)."""
    if not all(_is_tag(part) for part in error["loc"][cut + 1 :]):  # inside the member (past any union in it)
        return True
    if error["type"] == "literal_error":
        return isinstance(error["input"], str)
    return error["type"] not in _SHAPE


def _first(errors: list[Any]) -> Any:
    """The first error at the API's path. pydantic names the member of a union in an error's location: when one
    member fits the value (a list for `str | list[Block]`, the one class a `tagged` union picks), the error is that
    member's, with its name dropped; otherwise the members' errors fold into one type error at the union's own path:
    `expected a string or an array` for `input`, not `input.str`."""
    first = errors[0]
    loc = first["loc"]
    cut = next((i for i, part in enumerate(loc) if _is_tag(part)), None)
    if cut is None:
        return first
    prefix = loc[:cut]
    mine = [e for e in errors if e["loc"][:cut] == prefix and len(e["loc"]) > cut]
    tags = dict.fromkeys(e["loc"][cut] for e in mine)
    fitting = list(dict.fromkeys(e["loc"][cut] for e in mine if _fits(e, cut)))
    if len(tags) == 1 or len(fitting) == 1:
        tag = fitting[0] if len(fitting) == 1 else first["loc"][cut]
        return _first([{**e, "loc": (*prefix, *e["loc"][cut + 1 :])} for e in mine if e["loc"][cut] == tag])
    what = " or ".join(dict.fromkeys(_tag_phrase(str(t)) for t in tags))
    # the union's own value is in the errors of members that failed on it, not deeper inside it
    value = next((e["input"] for e in mine if len(e["loc"]) == cut + 1), first["input"])
    return {"type": "expected", "loc": prefix, "input": value, "msg": f"Input should be {what}", "ctx": {"what": what}}


def _translate(error: Any, wording: Wording) -> InvalidRequest:
    kind, name, value = error["type"], param_path(error["loc"]), error.get("input")
    ctx = error.get("ctx") or {}
    if kind == "extra_forbidden":
        return InvalidRequest(wording.unknown(name), param=name)
    if kind == "unknown_type":  # a `tagged` union's: the object's `type` names none of its classes
        given = value.get("type") if isinstance(value, dict) else None
        if wording.invalid is not None:
            return InvalidRequest(wording.invalid(f"{name}.type", f"Input should be {error['msg']}"), param=f"{name}.type")
        return InvalidRequest(f"Invalid value for '{name}.type': {given!r}. Supported values are: {error['msg']}.",
                              param=f"{name}.type")
    if kind == "unsupported_value":
        return InvalidRequest(f"'{name}' value {value!r} is not supported: {ctx['why']}", param=name)
    if wording.invalid is not None:
        message = "Input should be an object" if kind in ("model_type", "model_attributes_type") else error["msg"]
        return InvalidRequest(wording.invalid(name, message), param=name)
    if kind == "missing":
        return InvalidRequest(f"Missing required parameter: '{name}'.", param=name)
    expected = ctx["what"] if kind == "expected" else _EXPECTED.get(kind)
    if expected is not None:
        return InvalidRequest(
            f"Invalid type for '{name}': expected {expected}, but got {json_type(value)} instead.", param=name
        )
    if kind in _BOUND:
        key, words = _BOUND[kind]
        return InvalidRequest(f"Invalid value for '{name}': {value!r} (must be {words} {ctx[key]}).", param=name)
    if kind == "literal_error":
        return InvalidRequest(f"Invalid value for '{name}': {value!r}. Supported values are: {ctx['expected']}.",
                              param=name)
    if kind == "string_pattern_mismatch":
        return InvalidRequest(f"'{name}' must match {ctx['pattern']}.", param=name)
    if kind in ("too_short", "string_too_short") and ctx.get("min_length") == 1:
        return InvalidRequest(f"'{name}' must not be empty.", param=name)
    if kind == "value_error":  # a validator's own message (`ValueError("...")`)
        return InvalidRequest(str(ctx.get("error", error["msg"])), param=name)
    return InvalidRequest(f"Invalid value for '{name}': {error['msg']}.", param=name)
