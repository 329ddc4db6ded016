"""The docstrings the API reference is built from (issue 11).

The documentation site renders the API reference with mkdocstrings (python handler, griffe, google
style) in strict mode, where every warning griffe logs fails the build. This test reads the package
the way griffe does (statically, ``griffe.load``) and, for every public module — a module or package
whose own name and whose parents' names do not start with ``_``, outside the command line
(``attnlab.cli``) — checks each public object, i.e. each name in the module's ``__all__``:

- every public function, class, method (not starting with ``_``) and property has a docstring;
- a function or method with parameters besides ``self``/``cls`` has an ``Args:`` section naming
  exactly the parameters of its signature, keyword-only ones included, none missing and none extra.
  ``*args``/``**kwargs`` may be left out; when documented they are written with their stars;
- a class documents the parameters of its ``__init__`` in its own docstring, by the same rule
  (a dataclass may list its fields under ``Attributes:`` instead of ``Args:``);
- a function that returns something (a return annotation other than ``None``) has a ``Returns:``
  section, and a generator (a function whose body yields; ``@contextmanager`` ones too) a
  ``Yields:`` section, unless it yields nothing (``Iterator[None]``);
- a function, method or class whose signature takes or returns a tensor (``Tensor`` in an
  annotation) has a ``Shape:`` section;
- griffe's own google parser logs no warning for the docstrings of the module, of each checked
  object and of a class's ``__init__`` (what mkdocstrings would turn into a failed build).

An object re-exported by several modules is checked once, under the module that defines it when
that module is public and exports it, else under the first public module that exports it.
"""

from __future__ import annotations

import ast
import logging
import re
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import griffe
import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "attnlab"
# not public API: the command line parses and prints only
EXCLUDED_MODULES = ("attnlab.cli",)

_TENSOR = re.compile(r"\bTensor\b")
_NO_RETURN = {"None", "NoReturn", "Never", "typing.NoReturn", "typing.Never"}
# a generator that yields nothing (a context manager without ``as``) needs no Yields section
_YIELDS_NONE = re.compile(r"^(?:\w+\.)*(?:Iterator|Generator|Iterable)\[None\b")


# ----------------------------------------------------------------------------------------------
# the rules, on griffe objects (so that a fake module can be fed to them)


@dataclass
class Problem:
    """One thing missing or wrong in one docstring."""

    path: str  # the object's dotted path
    module: str  # the module that defines it
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


@contextmanager
def _griffe_warnings() -> Iterator[list[str]]:
    """Collect what griffe logs (its docstring parsers warn through the ``griffe`` logger)."""
    messages: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logger = logging.getLogger("griffe")
    handler = _Collect(level=logging.WARNING)
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def _parse(docstring: griffe.Docstring) -> tuple[list[griffe.DocstringSection], list[str]]:
    """The sections of a docstring and the warnings griffe's google parser logs for it."""
    with _griffe_warnings() as warnings:
        sections = griffe.parse_google(docstring)
    return sections, warnings


def _named_sections(sections: list[griffe.DocstringSection], kind: str) -> list[str]:
    names: list[str] = []
    for section in sections:
        if section.kind.value == kind:
            names.extend(item.name for item in section.value)
    return names


def _has_section(sections: list[griffe.DocstringSection], kind: str) -> bool:
    return any(section.kind.value == kind for section in sections)


def _has_shape(sections: list[griffe.DocstringSection]) -> bool:
    # "Shape:" is no google section griffe knows: it parses it as an admonition titled "Shape"
    return any(
        section.kind.value == "admonition" and (section.title or "").strip() == "Shape"
        for section in sections
    )


def _signature_parameters(parameters: griffe.Parameters) -> list[griffe.Parameter]:
    params = list(parameters)
    if params and params[0].name in ("self", "cls"):
        params = params[1:]
    return params


def _check_args(
    where: str, params: list[griffe.Parameter], documented: list[str], section: str = "Args"
) -> list[str]:
    """Problems of an Args section against a signature (variadics optional, with their stars)."""
    problems: list[str] = []
    expected: dict[str, bool] = {}  # documented name -> required
    for p in params:
        if p.kind is griffe.ParameterKind.var_positional:
            expected[f"*{p.name}"] = False
        elif p.kind is griffe.ParameterKind.var_keyword:
            expected[f"**{p.name}"] = False
        else:
            expected[p.name] = True
    if params and not documented:
        names = ", ".join(name for name, required in expected.items() if required)
        if names:
            return [f"{where}has parameters ({names}) but no {section}: section"]
    missing = [name for name, required in expected.items() if required and name not in documented]
    extra = [name for name in documented if name not in expected]
    duplicated = sorted({name for name in documented if documented.count(name) > 1})
    if missing:
        problems.append(f"{where}{section}: does not document {', '.join(missing)}")
    if extra:
        problems.append(
            f"{where}{section}: documents {', '.join(extra)}, not in the signature "
            f"({', '.join(expected) or 'no parameters'})"
        )
    if duplicated:
        problems.append(f"{where}{section}: documents {', '.join(duplicated)} more than once")
    return problems


def _takes_tensors(params: list[griffe.Parameter], returns: object = None) -> bool:
    annotations = [str(p.annotation) for p in params if p.annotation is not None]
    if returns is not None:
        annotations.append(str(returns))
    return any(_TENSOR.search(a) for a in annotations)


def _function_node(func: griffe.Function) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    source = func.source
    if not source:
        return None
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node
    return None


def _own_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a function's body, without those of nested functions, classes and lambdas."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        yield child
        yield from _own_nodes(child)


def _is_generator(func: griffe.Function) -> bool:
    node = _function_node(func)
    return node is not None and any(
        isinstance(n, (ast.Yield, ast.YieldFrom)) for n in _own_nodes(node)
    )


def _returns_something(func: griffe.Function) -> bool:
    if func.returns is not None:
        return str(func.returns) not in _NO_RETURN
    # no annotation: whether the body returns a value
    node = _function_node(func)
    if node is None:
        return False
    return any(
        isinstance(n, ast.Return)
        and n.value is not None
        and not (isinstance(n.value, ast.Constant) and n.value.value is None)
        for n in _own_nodes(node)
    )


def check_function(func: griffe.Function) -> list[str]:
    """What is missing from the docstring of one function, method or property."""
    if func.docstring is None or not func.docstring.value.strip():
        return ["has no docstring"]
    sections, warnings = _parse(func.docstring)
    problems = [f"griffe warns: {w}" for w in warnings]
    if "property" in func.labels:
        return problems  # a property documents itself by its docstring
    params = _signature_parameters(func.parameters)
    problems += _check_args("", params, _named_sections(sections, "parameters"))
    if _is_generator(func):
        yields_none = func.returns is not None and _YIELDS_NONE.match(str(func.returns))
        if not yields_none and not _has_section(sections, "yields"):
            problems.append("is a generator but has no Yields: section")
    elif _returns_something(func) and not _has_section(sections, "returns"):
        returns = f" ({func.returns})" if func.returns is not None else ""
        problems.append(f"returns a value{returns} but has no Returns: section")
    if _takes_tensors(params, func.returns) and not _has_shape(sections):
        problems.append("takes or returns a tensor but has no Shape: section")
    return problems


def check_class(cls: griffe.Class) -> dict[str, list[str]]:
    """What is missing from the docstrings of a class and of its public methods, by dotted path."""
    found: dict[str, list[str]] = {}
    problems: list[str] = []
    params = _signature_parameters(cls.parameters) if "__init__" in cls.all_members else []
    if cls.docstring is None or not cls.docstring.value.strip():
        problems.append("has no docstring")
    else:
        sections, warnings = _parse(cls.docstring)
        problems += [f"griffe warns: {w}" for w in warnings]
        documented = _named_sections(sections, "parameters")
        if "dataclass" in cls.labels and not documented:
            # a dataclass's __init__ takes its fields: an Attributes section documents them too
            attributes = _named_sections(sections, "attributes")
            required = [p.name for p in params]
            documented = [name for name in attributes if name in required]
        problems += _check_args("__init__ ", params, documented)
        if _takes_tensors(params) and not _has_shape(sections):
            problems.append("__init__ takes a tensor but the class has no Shape: section")
    init = cls.members.get("__init__")
    if isinstance(init, griffe.Function) and init.docstring is not None:
        _, warnings = _parse(init.docstring)
        problems += [f"__init__: griffe warns: {w}" for w in warnings]
    if problems:
        found[cls.path] = problems
    for name, member in cls.members.items():
        if name.startswith("_") or member.is_alias:
            continue
        if isinstance(member, griffe.Function):
            if method_problems := check_function(member):
                found[member.path] = method_problems
        elif isinstance(member, griffe.Class):
            found.update(check_class(member))
        elif isinstance(member, griffe.Attribute) and "property" in member.labels:
            if member.docstring is None or not member.docstring.value.strip():
                found[member.path] = ["has no docstring"]
    return found


def check_object(obj: griffe.Object) -> dict[str, list[str]]:
    """What is missing, by dotted path, for one public function or class (with its members)."""
    if isinstance(obj, griffe.Function):
        problems = check_function(obj)
        return {obj.path: problems} if problems else {}
    if isinstance(obj, griffe.Class):
        return check_class(obj)
    return {}


# ----------------------------------------------------------------------------------------------
# the package: public modules, their exports, who checks what


@cache
def _package() -> griffe.Module:
    package = griffe.load(PACKAGE, search_paths=[str(SRC)], docstring_parser="google")
    assert isinstance(package, griffe.Module)
    return package


def _is_public_module(path: str) -> bool:
    if any(path == m or path.startswith(m + ".") for m in EXCLUDED_MODULES):
        return False
    return not any(part.startswith("_") for part in path.split("."))


def _public_modules(module: griffe.Module) -> Iterator[griffe.Module]:
    if not _is_public_module(module.path):
        return
    yield module
    for name in sorted(module.modules):
        yield from _public_modules(module.modules[name])


@cache
def public_modules() -> tuple[str, ...]:
    return tuple(m.path for m in _public_modules(_package()))


def _exports(module: griffe.Module) -> list[str]:
    return [str(name) for name in (module.exports or [])]


@cache
def _owners() -> dict[str, str]:
    """Dotted path of each public function/class -> the public module that checks it."""
    owners: dict[str, str] = {}
    package = _package()
    exported_by: dict[str, list[str]] = {}
    for path in public_modules():
        module = package[path.removeprefix(PACKAGE + ".")] if path != PACKAGE else package
        for name in _exports(module):
            member = module.members.get(name)
            if member is None:
                continue
            try:
                target = member.final_target if member.is_alias else member
            except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                continue
            if isinstance(target, (griffe.Function, griffe.Class)):
                exported_by.setdefault(target.path, []).append(path)
    for target_path, modules in exported_by.items():
        defining = target_path.rsplit(".", 1)[0]
        owners[target_path] = defining if defining in modules else modules[0]
    return owners


def module_problems(module_path: str) -> list[Problem]:
    """Every docstring problem of the objects a public module checks (and of its own docstring)."""
    package = _package()
    module = package if module_path == PACKAGE else package[module_path.removeprefix(PACKAGE + ".")]
    problems: list[Problem] = []
    if module.docstring is None or not module.docstring.value.strip():
        problems.append(Problem(module_path, module_path, "the module has no docstring"))
    else:
        _, warnings = _parse(module.docstring)
        problems += [Problem(module_path, module_path, f"griffe warns: {w}") for w in warnings]
    for target_path, owner in sorted(_owners().items()):
        if owner != module_path:
            continue
        target = package[target_path.removeprefix(PACKAGE + ".")]
        for path, messages in check_object(target).items():
            problems += [Problem(path, target.module.path, m) for m in messages]
    return problems


# ----------------------------------------------------------------------------------------------
# the tests


@pytest.mark.parametrize("module_path", public_modules())
def test_public_docstrings(module_path: str) -> None:
    problems = module_problems(module_path)
    if problems:
        pytest.fail(
            f"{len(problems)} docstring problem(s) under {module_path}:\n"
            + "\n".join(f"  {p}" for p in problems),
            pytrace=False,
        )


def test_the_walk_finds_the_public_api() -> None:
    modules = public_modules()
    assert PACKAGE in modules and "attnlab.nn.attention" in modules
    assert not any(m.startswith("attnlab.cli") for m in modules)
    assert not any("._" in m for m in modules)
    owners = _owners()
    assert owners["attnlab.nn.attention.scaled_dot_product_attention"] == "attnlab.nn.attention"
    assert "attnlab.nn.multihead.MultiHeadAttention" in owners
    # the names of the top level are all checked somewhere
    for name in _exports(_package()):
        member = _package().members[name]
        target = member.final_target if member.is_alias else member
        if isinstance(target, (griffe.Function, griffe.Class)):
            assert target.path in owners, name


# ----------------------------------------------------------------------------------------------
# the rules catch what they should: a fake module with one mistake per function

_FAKE = '''
"""A fake module."""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

__all__ = [
    "Good", "GoodData", "NoArgs", "BadData", "good", "undocumented", "no_args", "missing_arg",
    "extra_arg", "missing_keyword_only", "no_returns", "no_yields", "no_shape", "bad_section",
    "stars", "unannotated_return", "managed", "quiet",
]


class Good:
    """A good class.

    Args:
        size: the size.
        weight: a weight.

    Shape:
        - weight ``(size,)``
    """

    def __init__(self, size: int, weight: torch.Tensor) -> None:
        self.size = size

    @property
    def width(self) -> int:
        """The width."""
        return self.size

    @property
    def height(self) -> int:
        return self.size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def _private(self, x: int) -> int:
        return x


@dataclass
class GoodData:
    """Fields documented as attributes.

    Attributes:
        a: the a.
        b: the b.
    """

    a: int
    b: int = 0


@dataclass
class BadData:
    """A field is not documented.

    Attributes:
        a: the a.
    """

    a: int
    b: int = 0


class NoArgs:
    """The parameters of __init__ are not documented."""

    def __init__(self, size: int) -> None:
        self.size = size


def good(x: torch.Tensor, *args: int, scale: float = 1.0, **kwargs: str) -> torch.Tensor:
    """Good.

    Args:
        x: the input.
        scale: a factor.
        **kwargs: anything.

    Returns:
        ``x * scale``.

    Shape:
        - x ``(B, T)``; output: the same.
    """
    return x * scale


def undocumented(x: int) -> int:
    return x


def no_args(x: int) -> None:
    """Does nothing."""


def missing_arg(x: int, y: int) -> None:
    """Does nothing.

    Args:
        x: the x.
    """


def extra_arg(x: int) -> None:
    """Does nothing.

    Args:
        x: the x.
        y: the y.
    """


def missing_keyword_only(x: int, *, y: int = 0) -> None:
    """Does nothing.

    Args:
        x: the x.
    """


def no_returns(x: int) -> int:
    """Returns, undocumented.

    Args:
        x: the x.
    """
    return x


def no_yields(n: int) -> Iterator[int]:
    """Yields, undocumented.

    Args:
        n: how many.

    Returns:
        numbers.
    """
    yield from range(n)


def no_shape(x: torch.Tensor) -> None:
    """Takes a tensor.

    Args:
        x: the input.
    """


def bad_section(x: int) -> None:
    """A section griffe cannot read.

    Args:
        x the x, without its colon.
    """


def stars(*args: int) -> None:
    """Variadics documented without their stars.

    Args:
        args: the numbers.
    """


def unannotated_return(x):
    """Returns, unannotated and undocumented.

    Args:
        x: the x.
    """
    return x


@contextmanager
def quiet() -> Iterator[None]:
    """A context manager that yields nothing needs no Yields section."""
    yield


@contextmanager
def managed(n: int) -> Iterator[int]:
    """A context manager.

    Args:
        n: a number.

    Yields:
        ``n``.
    """
    yield n
'''


@pytest.fixture(scope="module")
def fake() -> Iterator[dict[str, list[str]]]:
    with griffe.temporary_visited_package(
        "fake",
        {"__init__.py": _FAKE},
        extensions=griffe.load_extensions("dataclasses"),
        docstring_parser="google",
    ) as package:
        found: dict[str, list[str]] = {}
        for name in _exports(package):
            found.update(check_object(package[name]))
        yield found


def _one(found: dict[str, list[str]], path: str, fragment: str) -> None:
    messages = found.get(f"fake.{path}", [])
    assert any(fragment in m for m in messages), (path, messages)


def test_the_rules_pass_good_docstrings(fake: dict[str, list[str]]) -> None:
    for path in (
        "fake.good",
        "fake.Good",
        "fake.Good.width",
        "fake.GoodData",
        "fake.managed",
        "fake.quiet",
    ):
        assert path not in fake, (path, fake.get(path))
    # private methods are not checked
    assert "fake.Good._private" not in fake


def test_each_rule_catches_its_mistake(fake: dict[str, list[str]]) -> None:
    _one(fake, "undocumented", "has no docstring")
    _one(fake, "Good.height", "has no docstring")  # a property
    _one(fake, "Good.forward", "has no docstring")  # a method
    _one(fake, "no_args", "has parameters (x) but no Args: section")
    _one(fake, "missing_arg", "does not document y")
    _one(fake, "extra_arg", "documents y, not in the signature")
    _one(fake, "extra_arg", "griffe warns")  # griffe's own check of the same mistake
    _one(fake, "missing_keyword_only", "does not document y")
    _one(fake, "no_returns", "no Returns: section")
    _one(fake, "unannotated_return", "no Returns: section")
    _one(fake, "no_yields", "no Yields: section")
    _one(fake, "no_shape", "no Shape: section")
    _one(fake, "bad_section", "griffe warns")
    _one(fake, "stars", "documents args, not in the signature")
    _one(fake, "NoArgs", "has parameters (size) but no Args: section")
    _one(fake, "BadData", "does not document b")
