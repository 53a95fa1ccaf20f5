#!/usr/bin/env python3
"""Generate the documented flag/key lists of three training frameworks.

What it reads
-------------
Three read-only git mirrors (no work tree needed; files are read with
``git show REV:PATH`` and parsed with the standard ``ast`` module):

* Megatron-LM: the command-line flags of ``pretrain_gpt.py``.  The argument
  parser is assembled by ``megatron/training/arguments.py``
  (``add_megatron_arguments``).  Every group function it calls is scanned for
  ``add_argument`` calls, and every ``ArgumentGroupFactory(SomeConfig, exclude=...)``
  is expanded by reading the dataclass ``SomeConfig`` (fields, type
  annotations, defaults, ``metadata={"argparse_meta": ...}`` overrides and the
  attribute docstrings) and applying the same naming rules as the factory in
  ``megatron/training/argument_utils.py`` (``--field-name``; bool fields whose
  default is not ``False`` become ``--no-field-name``/``--disable-field-name``).
  The ``extra_args_provider`` passed by ``pretrain_gpt.py`` (the ModelOpt
  arguments, only active when nvidia-modelopt is installed) is included too.
* torchtitan: ``torchtitan/config/job_config.py`` -- every field of the
  dataclasses reachable from ``JobConfig`` becomes a ``section.key`` (nested
  dataclasses ``section.sub.key``), which is the TOML table/key and the
  ``--section.key`` CLI flag.  Also the model flavors of llama3, llama4,
  deepseek_v3 and qwen3 (``torchtitan/models/<name>/__init__.py``), the
  pipeline schedule names and the selective activation-checkpoint options.
* DeepSpeed: the ds_config JSON keys.  ``DeepSpeedConfig`` in
  ``deepspeed/runtime/config.py`` (and ``deepspeed.initialize``) is walked by a
  small abstract interpreter that follows the config dict through the helper
  functions and classes it is passed to (``get_scalar_param``, ``dict.get``,
  subscripts, ``in`` tests, pydantic models built with ``Model(**d)``).
  Pydantic models contribute their field names and ``Field(alias=...)``
  aliases.  Keys that appear in the JSON examples of
  ``docs/_pages/config-json.md`` are marked ``documented`` (and added when
  their parent is known).  Optimizer/scheduler ``params`` come from the
  constructor signatures DeepSpeed instantiates, and the ``deepspeed``
  launcher options from ``deepspeed/launcher/runner.py``.

What it writes
--------------
``<out-dir>/megatron-lm.json``, ``<out-dir>/torchtitan.json`` and
``<out-dir>/deepspeed.json`` (2-space indented JSON, lists sorted by name).
The output depends only on the given revisions, so rerunning it gives
byte-identical files.

How to rerun
------------
    python3 scripts/framework_flags.py \\
        --megatron /work/.mirror/NVIDIA+Megatron-LM/repo \\
        --megatron-rev d98e8a64ddf34856e74b24714e3bedb2f5a39553 \\
        --torchtitan /work/.mirror/pytorch+torchtitan/repo --torchtitan-rev v0.2.2 \\
        --deepspeed /work/.mirror/deepspeedai+DeepSpeed/repo \\
        --deepspeed-rev edaa7221267243c7be7fb49c5d5f5c4fb97b4641 \\
        --out-dir resources/frameworks

(these are also the defaults).  Only the Python 3 standard library and the
``git`` executable are needed.  Warnings about constructs the extractor could
not interpret are printed on stderr.
"""

import argparse
import ast
import inspect
import json
import math
import os
import re
import subprocess
import sys

GENERATOR = "scripts/framework_flags.py"

DEFAULT_MEGATRON = "/work/.mirror/NVIDIA+Megatron-LM/repo"
DEFAULT_MEGATRON_REV = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
DEFAULT_TORCHTITAN = "/work/.mirror/pytorch+torchtitan/repo"
DEFAULT_TORCHTITAN_REV = "v0.2.2"
DEFAULT_DEEPSPEED = "/work/.mirror/deepspeedai+DeepSpeed/repo"
DEFAULT_DEEPSPEED_REV = "edaa7221267243c7be7fb49c5d5f5c4fb97b4641"


def warn(msg):
    print("warning: " + msg, file=sys.stderr)


class NotLiteral(Exception):
    """Raised when an expression has no static (literal) value."""


MISSING = object()


# ---------------------------------------------------------------------------
# Reading a git revision
# ---------------------------------------------------------------------------

class Repo:
    """Read-only view of one revision of a git repository."""

    def __init__(self, gitdir, rev):
        self.gitdir = gitdir
        self.rev = rev
        self.commit = self._git("rev-parse", "--verify", rev + "^{commit}").strip()
        self.date = self._git("log", "-1", "--format=%cs", self.commit).strip()
        names = self._git("ls-tree", "-r", "--name-only", self.commit)
        self.files = set(names.splitlines())
        self._text = {}
        self._tree = {}

    def _git(self, *args):
        out = subprocess.run(["git", "-C", self.gitdir] + list(args),
                             check=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        return out.stdout.decode("utf-8")

    def version(self):
        """Release tag pointing exactly at the commit, else 'main'."""
        try:
            tags = self._git("tag", "--points-at", self.commit).split()
        except subprocess.CalledProcessError:
            tags = []
        releases = sorted(t for t in tags if re.match(r"^v?\d+(\.\d+)+", t))
        if self.rev in releases:
            return self.rev
        return releases[-1] if releases else "main"

    def exists(self, path):
        return path in self.files

    def read(self, path):
        if path not in self._text:
            if path not in self.files:
                self._text[path] = None
            else:
                self._text[path] = self._git("show", self.commit + ":" + path)
        return self._text[path]

    def tree(self, path):
        if path not in self._tree:
            text = self.read(path)
            self._tree[path] = None if text is None else ast.parse(text, filename=path)
        return self._tree[path]

    def module_file(self, dotted):
        base = dotted.replace(".", "/")
        for cand in (base + ".py", base + "/__init__.py"):
            if cand in self.files:
                return cand
        return None


def package_of(path):
    parts = path.split("/")[:-1]
    return ".".join(parts)


def absolute_module(path, node):
    """Dotted module named by an ImportFrom node seen in file `path`."""
    if not node.level:
        return node.module or ""
    pkg = package_of(path).split(".")
    if path.endswith("/__init__.py"):
        pass  # the package itself is the directory
    up = node.level - 1
    if up:
        pkg = pkg[:-up]
    base = ".".join(p for p in pkg if p)
    if node.module:
        return base + "." + node.module if base else node.module
    return base


def top_level_statements(body):
    """Module-level statements, looking into if/try blocks."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            yield from top_level_statements(stmt.body)
            yield from top_level_statements(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            yield from top_level_statements(stmt.body)
            for h in stmt.handlers:
                yield from top_level_statements(h.body)
            yield from top_level_statements(stmt.orelse)
            yield from top_level_statements(stmt.finalbody)
        else:
            yield stmt


# ---------------------------------------------------------------------------
# Resolving names and evaluating literal expressions
# ---------------------------------------------------------------------------

class Resolver:
    """Finds where a name used in a file is defined, following imports."""

    def __init__(self, repo):
        self.repo = repo
        self.used = set()   # files in which a looked-up name was found

    def definitions(self, path):
        tree = self.repo.tree(path)
        return [] if tree is None else list(top_level_statements(tree.body))

    def lookup(self, path, name, extra_imports=(), _seen=None):
        """Return ('class'|'function'|'value'|'module', file, node) or None."""
        if _seen is None:
            _seen = set()
        if (path, name) in _seen:
            return None
        _seen.add((path, name))
        for imp in extra_imports:
            hit = self._from_import(path, imp, name, _seen)
            if hit:
                return hit
        stmts = self.definitions(path)
        found = None
        for stmt in stmts:
            if isinstance(stmt, ast.ClassDef) and stmt.name == name:
                found = ("class", path, stmt)
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == name:
                found = ("function", path, stmt)
            elif isinstance(stmt, ast.Assign):
                for tgt in stmt.targets:
                    if isinstance(tgt, ast.Name) and tgt.id == name:
                        found = ("value", path, stmt.value)
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) \
                    and stmt.target.id == name and stmt.value is not None:
                found = ("value", path, stmt.value)
        if found:
            if found[0] == "value":
                self.used.add(path)
            return found
        for stmt in stmts:
            if isinstance(stmt, ast.ImportFrom):
                hit = self._from_import(path, stmt, name, _seen)
                if hit:
                    return hit
            elif isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    bound = alias.asname or alias.name.split(".")[0]
                    if bound == name:
                        target = alias.name if alias.asname else alias.name.split(".")[0]
                        mf = self.repo.module_file(target)
                        return ("module", mf, target)
        return None

    def _from_import(self, path, stmt, name, _seen):
        if not isinstance(stmt, ast.ImportFrom):
            return None
        mod = absolute_module(path, stmt)
        for alias in stmt.names:
            if alias.name == "*":
                mf = self.repo.module_file(mod)
                if mf:
                    hit = self.lookup(mf, name, (), _seen)
                    if hit:
                        return hit
                continue
            if (alias.asname or alias.name) != name:
                continue
            mf = self.repo.module_file(mod)
            if mf:
                hit = self.lookup(mf, alias.name, (), _seen)
                if hit:
                    return hit
            sub = self.repo.module_file(mod + "." + alias.name) if mod else None
            if sub:
                return ("module", sub, mod + "." + alias.name)
            return ("external", mod, alias.name)
        return None

    def resolve_expr(self, path, node, extra_imports=()):
        """Resolve a Name or dotted Attribute to its definition."""
        if isinstance(node, ast.Name):
            return self.lookup(path, node.id, extra_imports)
        if isinstance(node, ast.Attribute):
            base = self.resolve_expr(path, node.value, extra_imports)
            if base and base[0] == "module" and base[1]:
                return self.lookup(base[1], node.attr)
            if base and base[0] == "class":
                for stmt in base[2].body:
                    if isinstance(stmt, ast.ClassDef) and stmt.name == node.attr:
                        return ("class", base[1], stmt)
        return None

    # -- classes ---------------------------------------------------------------
    def class_bases(self, path, cls):
        out = []
        for b in cls.bases:
            hit = self.resolve_expr(path, b)
            if hit and hit[0] == "class":
                out.append((hit[1], hit[2]))
        return out

    def base_names(self, path, cls, _depth=0):
        """Names of all (transitive) base classes, resolved or not."""
        names = []
        for b in cls.bases:
            names.append(ast.unparse(b))
            hit = self.resolve_expr(path, b)
            if hit and hit[0] == "class" and _depth < 20:
                names.extend(self.base_names(hit[1], hit[2], _depth + 1))
        return names

    def is_enum(self, path, cls):
        return any(n.split(".")[-1] in ("Enum", "IntEnum", "StrEnum", "Flag", "IntFlag")
                   for n in self.base_names(path, cls))

    def enum_members(self, path, cls):
        """[(name, value-or-MISSING)] of an Enum class, in order."""
        members = []
        for stmt in cls.body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                    and isinstance(stmt.targets[0], ast.Name):
                name = stmt.targets[0].id
                if name.startswith("_"):
                    continue
                try:
                    val = Evaluator(self).value(stmt.value, path)
                except NotLiteral:
                    val = MISSING
                if isinstance(val, list) and val:
                    val = val[0]
                members.append((name, val))
        return members


class Evaluator:
    """Static evaluation of literal-like expressions (constants, folding)."""

    def __init__(self, resolver, enum_as="value"):
        self.resolver = resolver
        self.enum_as = enum_as
        self._stack = set()

    def value(self, node, path, extra_imports=()):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            out = []
            for elt in node.elts:
                if isinstance(elt, ast.Starred):
                    out.extend(self.value(elt.value, path, extra_imports))
                else:
                    out.append(self.value(elt, path, extra_imports))
            return out
        if isinstance(node, ast.Dict):
            out = {}
            for k, v in zip(node.keys, node.values):
                if k is None:
                    out.update(self.value(v, path, extra_imports))
                    continue
                key = self.value(k, path, extra_imports)
                if not isinstance(key, (str, int, float, bool)) and key is not None:
                    raise NotLiteral()
                out[key] = self.value(v, path, extra_imports)
            return out
        if isinstance(node, ast.UnaryOp):
            v = self.value(node.operand, path, extra_imports)
            if isinstance(node.op, ast.USub) and isinstance(v, (int, float)):
                return -v
            if isinstance(node.op, ast.UAdd) and isinstance(v, (int, float)):
                return +v
            if isinstance(node.op, ast.Not):
                return not v
            raise NotLiteral()
        if isinstance(node, ast.BinOp):
            a = self.value(node.left, path, extra_imports)
            b = self.value(node.right, path, extra_imports)
            ops = {ast.Add: lambda x, y: x + y, ast.Sub: lambda x, y: x - y,
                   ast.Mult: lambda x, y: x * y, ast.Div: lambda x, y: x / y,
                   ast.FloorDiv: lambda x, y: x // y, ast.Mod: lambda x, y: x % y,
                   ast.Pow: lambda x, y: x ** y}
            fn = ops.get(type(node.op))
            if fn is None or isinstance(a, dict) or isinstance(b, dict):
                raise NotLiteral()
            try:
                return fn(a, b)
            except Exception:
                raise NotLiteral()
        if isinstance(node, ast.Name):
            return self._name(node.id, path, extra_imports)
        if isinstance(node, ast.Attribute):
            dotted = ast.unparse(node)
            if self.enum_as == "name" and re.match(r"^signal\.SIG[A-Z0-9]+$", dotted):
                return node.attr   # stdlib enum member, given by name on the CLI
            if dotted == "sys.maxsize":
                return sys.maxsize
            hit = self.resolver.resolve_expr(path, node.value, extra_imports)
            if hit and hit[0] == "class" and self.resolver.is_enum(hit[1], hit[2]):
                self.resolver.used.add(hit[1])
                for name, val in self.resolver.enum_members(hit[1], hit[2]):
                    if name == node.attr:
                        if self.enum_as == "name" or val is MISSING:
                            return name
                        return val
            if hit and hit[0] == "module" and hit[1]:
                return self._name(node.attr, hit[1], ())
            raise NotLiteral()
        if isinstance(node, ast.Call):
            fname = ast.unparse(node.func).split(".")[-1]
            if fname in ("int", "float", "str", "bool", "pp_int") and node.args:
                v = self.value(node.args[0], path, extra_imports)
                conv = {"int": int, "pp_int": int, "float": float, "str": str, "bool": bool}[fname]
                try:
                    return conv(v)
                except Exception:
                    raise NotLiteral()
            dotted = ast.unparse(node.func)
            if dotted in ("os.getenv", "os.environ.get") and len(node.args) == 2:
                # value when the environment variable is not set
                return self.value(node.args[1], path, extra_imports)
            if fname in ("list", "dict", "tuple", "set") and not node.args and not node.keywords:
                return {} if fname == "dict" else []
            if fname == "dict" and not node.args:
                return {k.arg: self.value(k.value, path, extra_imports) for k in node.keywords}
            raise NotLiteral()
        if isinstance(node, ast.Lambda):
            return self.value(node.body, path, extra_imports)
        raise NotLiteral()

    def _name(self, name, path, extra_imports):
        key = (path, name)
        if key in self._stack:
            raise NotLiteral()
        hit = self.resolver.lookup(path, name, extra_imports)
        if not hit or hit[0] != "value":
            raise NotLiteral()
        self._stack.add(key)
        try:
            return self.value(hit[2], hit[1])
        finally:
            self._stack.discard(key)

    def factory_value(self, node, path, extra_imports=()):
        """Value produced by a dataclass default_factory."""
        if isinstance(node, ast.Name) and node.id in ("list", "dict", "set", "tuple"):
            return {} if node.id == "dict" else []
        return self.value(node, path, extra_imports)

    def maybe(self, node, path, extra_imports=(), default=None):
        if node is None:
            return default
        try:
            return self.value(node, path, extra_imports)
        except NotLiteral:
            return default


def json_safe(v):
    """Convert a Python literal into something json.dumps accepts."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, (list, tuple, set)):
        return [json_safe(x) for x in v]
    if isinstance(v, dict):
        return {str(k): json_safe(x) for k, x in sorted(v.items(), key=lambda kv: str(kv[0]))}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return None


def clean_doc(text):
    return " ".join(inspect.cleandoc(text).split()) if isinstance(text, str) else ""


# ---------------------------------------------------------------------------
# Type annotations
# ---------------------------------------------------------------------------

BUILTIN_TYPES = {"int", "float", "str", "bool", "list", "dict", "tuple", "set",
                 "bytes", "object", "Any"}


def ann_struct(resolver, path, node):
    """Structured form of a type annotation.

    ('none',) | ('name', text) | ('enum', cls_name, members) | ('model', file, ClassDef)
    | ('union', [..]) | ('list', [..]) | ('literal', [..]) | ('other', text)
    """
    if node is None:
        return ("other", "")
    if isinstance(node, ast.Constant):
        if node.value is None:
            return ("none",)
        if isinstance(node.value, str):
            try:
                return ann_struct(resolver, path, ast.parse(node.value, mode="eval").body)
            except SyntaxError:
                return ("other", node.value)
        return ("other", repr(node.value))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return union_of([ann_struct(resolver, path, node.left),
                         ann_struct(resolver, path, node.right)])
    if isinstance(node, (ast.Name, ast.Attribute)):
        text = ast.unparse(node)
        short = text.split(".")[-1]
        if text in BUILTIN_TYPES or (short in BUILTIN_TYPES and text.startswith("typing.")):
            return ("name", short)
        if short in ("List", "Dict", "Tuple", "Set", "Sequence", "Callable", "Optional", "Union"):
            return ("other", text)
        hit = resolver.resolve_expr(path, node)
        if hit and hit[0] == "class":
            if resolver.is_enum(hit[1], hit[2]):
                resolver.used.add(hit[1])
                return ("enum", hit[2].name, resolver.enum_members(hit[1], hit[2]))
            return ("model", hit[1], hit[2])
        return ("name", text)
    if isinstance(node, ast.Subscript):
        base = ast.unparse(node.value).split(".")[-1]
        sl = node.slice
        args = list(sl.elts) if isinstance(sl, ast.Tuple) else [sl]
        if base == "Optional":
            return union_of([ann_struct(resolver, path, args[0]), ("none",)])
        if base == "Union":
            return union_of([ann_struct(resolver, path, a) for a in args])
        if base in ("List", "list", "Sequence", "Set", "set"):
            return ("list", [ann_struct(resolver, path, a) for a in args])
        if base == "Literal":
            vals = []
            for a in args:
                try:
                    vals.append(Evaluator(resolver).value(a, path))
                except NotLiteral:
                    vals.append(ast.unparse(a))
            return ("literal", vals)
        if base == "Annotated":
            return ann_struct(resolver, path, args[0])
        return ("other", ast.unparse(node))
    return ("other", ast.unparse(node))


def union_of(members):
    flat = []
    for m in members:
        if m[0] == "union":
            flat.extend(m[1])
        else:
            flat.append(m)
    return ("union", flat)


def strip_optional(ts):
    if ts[0] == "union":
        rest = [m for m in ts[1] if m[0] != "none"]
        if len(rest) == 1:
            return rest[0]
        return ("union", rest)
    return ts


def literal_choices(ts):
    ts = strip_optional(ts)
    if ts[0] == "literal":
        return list(ts[1])
    if ts[0] == "union" and all(m[0] == "literal" for m in ts[1]):
        out = []
        for m in ts[1]:
            out.extend(m[1])
        return out
    return None


def json_type_name(ts):
    """JSON-ish type name of an annotation structure (DeepSpeed keys)."""
    ts = strip_optional(ts)
    kind = ts[0]
    if kind == "name":
        return {"int": "int", "float": "float", "str": "str", "bool": "bool",
                "list": "list", "tuple": "list", "set": "list", "dict": "object",
                "Path": "str", "pathlib.Path": "str"}.get(ts[1], ts[1])
    if kind == "enum":
        vals = [v for _, v in ts[2] if v is not MISSING]
        if vals and all(isinstance(v, bool) for v in vals):
            return "bool"
        if vals and all(isinstance(v, int) for v in vals):
            return "int"
        return "str"
    if kind == "model":
        return "object"
    if kind == "list":
        return "list"
    if kind == "literal":
        types = sorted({type(v).__name__ for v in ts[1]})
        return types[0] if len(types) == 1 else "|".join(types)
    if kind == "union":
        names = []
        for m in ts[1]:
            n = json_type_name(m)
            if n not in names:
                names.append(n)
        return "|".join(names)
    if kind == "other":
        t = ts[1].split("[")[0].split(".")[-1]
        if t in ("Dict", "dict"):
            return "object"
        if t in ("Tuple", "tuple", "List", "list"):
            return "list"
        return ts[1] or None
    return None


# ---------------------------------------------------------------------------
# Dataclass / pydantic model fields
# ---------------------------------------------------------------------------

class FieldInfo:
    __slots__ = ("name", "ann", "default", "factory", "meta", "init", "doc",
                 "path", "lineno", "alias", "deprecated", "field_call")

    def __init__(self, name, ann, path, lineno):
        self.name = name
        self.ann = ann
        self.default = MISSING      # ast node of the default value
        self.factory = None         # ast node of default_factory
        self.meta = None            # ast.Dict of argparse_meta
        self.init = True
        self.doc = ""
        self.path = path
        self.lineno = lineno
        self.alias = None
        self.deprecated = False
        self.field_call = None


def is_field_call(node):
    return isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in ("field", "Field")


def class_fields(resolver, path, cls, stop_bases=(), _depth=0):
    """Ordered dataclass/pydantic fields of `cls`, including inherited ones."""
    fields = {}
    if _depth < 20:
        for bpath, bcls in resolver.class_bases(path, cls):
            if bcls.name in stop_bases:
                continue
            for name, info in class_fields(resolver, bpath, bcls, stop_bases, _depth + 1).items():
                fields[name] = info
    body = cls.body
    for i, stmt in enumerate(body):
        if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
            continue
        ann_text = ast.unparse(stmt.annotation)
        if re.match(r"^(typing\.)?(ClassVar|InitVar)\b", ann_text) or ann_text.endswith("KW_ONLY"):
            continue
        name = stmt.target.id
        if name == "model_config":
            continue
        info = FieldInfo(name, stmt.annotation, path, stmt.lineno)
        val = stmt.value
        if val is not None and is_field_call(val):
            info.field_call = val
            fname = ast.unparse(val.func).split(".")[-1]
            if fname == "Field" and val.args:
                info.default = val.args[0]
            for kw in val.keywords:
                if kw.arg == "default":
                    info.default = kw.value
                elif kw.arg == "default_factory":
                    info.factory = kw.value
                elif kw.arg == "init":
                    info.init = not (isinstance(kw.value, ast.Constant) and kw.value.value is False)
                elif kw.arg == "alias" and isinstance(kw.value, ast.Constant):
                    info.alias = kw.value.value
                elif kw.arg == "deprecated":
                    info.deprecated = not (isinstance(kw.value, ast.Constant) and not kw.value.value)
                elif kw.arg == "metadata" and isinstance(kw.value, ast.Dict):
                    for k, v in zip(kw.value.keys, kw.value.values):
                        if isinstance(k, ast.Constant) and k.value == "argparse_meta" \
                                and isinstance(v, ast.Dict):
                            info.meta = v
                elif kw.arg == "json_schema_extra" and isinstance(kw.value, ast.Dict):
                    for k, v in zip(kw.value.keys, kw.value.values):
                        if isinstance(k, ast.Constant) and k.value == "deprecated" \
                                and isinstance(v, ast.Constant) and v.value:
                            info.deprecated = True
        elif val is not None:
            info.default = val
        if i + 1 < len(body):
            nxt = body[i + 1]
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) \
                    and isinstance(nxt.value.value, str):
                info.doc = clean_doc(nxt.value.value)
        fields[name] = info
    return fields


def find_class(tree, name):
    for stmt in top_level_statements(tree.body):
        if isinstance(stmt, ast.ClassDef) and stmt.name == name:
            return stmt
    return None


def find_function(tree, name):
    for stmt in top_level_statements(tree.body):
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == name:
            return stmt
    return None


def calls_in_order(node):
    calls = [n for n in ast.walk(node) if isinstance(n, ast.Call)]
    calls.sort(key=lambda c: (c.lineno, c.col_offset))
    return calls


def enclosing_conditions(fn):
    """{id(call): 'cond and cond'} for calls nested in if-statements of `fn`."""
    out = {}

    def visit(node, conds):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If):
                visit_block(child.body, conds + [ast.unparse(child.test)])
                visit_block(child.orelse, conds + ["not (%s)" % ast.unparse(child.test)])
            else:
                if isinstance(child, ast.Call) and conds:
                    out[id(child)] = " and ".join(conds)
                visit(child, conds)

    def visit_block(stmts, conds):
        for st in stmts:
            if isinstance(st, ast.If):
                visit_block(st.body, conds + [ast.unparse(st.test)])
                visit_block(st.orelse, conds + ["not (%s)" % ast.unparse(st.test)])
            else:
                if isinstance(st, ast.Call) and conds:
                    out[id(st)] = " and ".join(conds)
                visit(st, conds)

    visit_block(fn.body, [])
    return out


def function_imports(fn):
    return [n for n in ast.walk(fn) if isinstance(n, ast.ImportFrom)]


# ---------------------------------------------------------------------------
# argparse extraction (shared by Megatron and the DeepSpeed launcher)
# ---------------------------------------------------------------------------

NO_VALUE_ACTIONS = {"store_true", "store_false", "store_const", "append_const",
                    "count", "help", "version", "BooleanOptionalAction"}

def help_says_deprecated(text):
    """Heuristic: does the help text mark the option itself as deprecated?

    Texts that only call some *value* deprecated ("dist_muon is deprecated",
    "'x' is a deprecated alias of 'y'") do not count.
    """
    if not text:
        return False
    low = " ".join(text.split())
    # "Deprecated ...", "[DEPRECATED] ...", "DEPRECATED: ..." at the start
    if re.search(r"^\W*deprecated\b", low, re.I):
        return True
    # "... . Deprecated: use ..." / "... .DEPRECATED. Please ..." starting a sentence
    for m in re.finditer(r"\bdeprecated\s*[:.,;)\]-]", low, re.I):
        before = low[:m.start()].rstrip()
        if not before or before.endswith((".", ":", "[", "(", "-")):
            return True
    if re.search(r"\b(this|the)\s+(flag|argument|option|arg|parameter)\s+is\s+deprecated",
                 low, re.I):
        return True
    if re.search(r"\(deprecated\)", low, re.I):
        return True
    # "Old ... argument, do not use"
    if re.search(r"^\W*old\b.*\b(argument|parameter)\b.*\bdo not use\b", low, re.I):
        return True
    return False


def comment_above(repo, path, lineno):
    """Text of the comment lines directly above `lineno` (1-based)."""
    lines = (repo.read(path) or "").splitlines()
    out = []
    i = lineno - 2
    while 0 <= i < len(lines) and lines[i].strip().startswith("#"):
        out.append(lines[i].strip().lstrip("#").strip())
        i -= 1
    return " ".join(reversed(out))


def str_value(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for v in node.values:
            parts.append(v.value if isinstance(v, ast.Constant) else "{...}")
        return "".join(parts)
    return None


def choices_value(ev, resolver, node, path, extra_imports=()):
    """Literal choices, or the names/values of an enum iterated in a list comprehension."""
    if node is None:
        return None
    try:
        v = ev.value(node, path, extra_imports)
        return list(v) if isinstance(v, (list, tuple)) else None
    except NotLiteral:
        pass
    if isinstance(node, ast.ListComp) and len(node.generators) == 1:
        gen = node.generators[0]
        hit = resolver.resolve_expr(path, gen.iter, extra_imports)
        if hit and hit[0] == "class" and resolver.is_enum(hit[1], hit[2]) \
                and isinstance(node.elt, ast.Attribute) and isinstance(gen.target, ast.Name) \
                and isinstance(node.elt.value, ast.Name) and node.elt.value.id == gen.target.id:
            members = resolver.enum_members(hit[1], hit[2])
            if node.elt.attr == "name":
                return [n for n, _ in members]
            if node.elt.attr == "value":
                return [v for _, v in members]
    if isinstance(node, ast.Call) and ast.unparse(node.func) == "list" and len(node.args) == 1:
        hit = resolver.resolve_expr(path, node.args[0], extra_imports)
        if hit and hit[0] == "class" and resolver.is_enum(hit[1], hit[2]):
            return [n for n, _ in resolver.enum_members(hit[1], hit[2])]
    return None


def argparse_records(repo, resolver, ev, path, call, extra_imports=(), long_only=True,
                     condition=None):
    """Flag records of one add_argument(...) call (empty for positionals)."""
    opts = [str_value(a) for a in call.args]
    if not opts or any(o is None for o in opts) or not all(o.startswith("-") for o in opts):
        return []
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    action = None
    if "action" in kw:
        a = kw["action"]
        action = a.value if isinstance(a, ast.Constant) else ast.unparse(a).split(".")[-1]
    names = list(opts)
    if action == "BooleanOptionalAction":
        names += ["--no-" + o[2:] for o in opts if o.startswith("--")]
    longs = [o for o in opts if o.startswith("--")]
    if "dest" in kw and isinstance(kw["dest"], ast.Constant):
        dest = kw["dest"].value
    else:
        first = longs[0] if longs else opts[0]
        dest = first.lstrip("-").replace("-", "_")
    takes_value = action not in NO_VALUE_ACTIONS
    type_name, type_fn = None, None
    if "type" in kw:
        t = ast.unparse(kw["type"])
        if t in ("int", "float", "str", "bool"):
            type_name = t
        else:
            type_fn = t
    elif takes_value:
        type_name = "str"
    if action in ("store_true", "store_false", "BooleanOptionalAction"):
        type_name = "bool"
    elif action == "count":
        type_name = "int"
    default = ev.maybe(kw.get("default"), path, extra_imports)
    if "default" not in kw:
        default = {"store_true": False, "store_false": True}.get(action)
    help_node = kw.get("help")
    help_text = str_value(help_node) if help_node is not None else ""
    hidden = help_node is not None and ast.unparse(help_node).endswith("SUPPRESS")
    nargs = None
    if "nargs" in kw:
        nargs = ev.maybe(kw["nargs"], path, extra_imports, ast.unparse(kw["nargs"]))
        if isinstance(nargs, str) and nargs.startswith("argparse."):
            nargs = nargs.split(".")[-1]
    deprecated = ("deprecated" in dest.lower() or help_says_deprecated(help_text)
                  or "deprecated" in comment_above(repo, path, call.lineno).lower())
    base = {
        "value": takes_value,
        "type": type_name,
        "choices": json_safe(choices_value(ev, resolver, kw.get("choices"), path, extra_imports)),
        "dest": dest,
        "deprecated": deprecated,
        "nargs": json_safe(nargs),
        "default": json_safe(default),
        "action": action,
        "hidden": hidden,
        "origin": "%s:%d" % (path, call.lineno),
    }
    if type_fn:
        base["type_fn"] = type_fn
    if condition:
        base["condition"] = condition
    out = []
    for n in names:
        if long_only and not n.startswith("--"):
            continue
        rec = {"name": n}
        rec.update(base)
        rec["aliases"] = sorted(x for x in names if x != n)
        if n.startswith("--no-") and action == "BooleanOptionalAction" and n not in opts:
            rec["negates"] = "--" + n[5:]
        out.append(rec)
    return out


# ---------------------------------------------------------------------------
# Megatron-LM
# ---------------------------------------------------------------------------

class MegatronExtractor:
    ARGS = "megatron/training/arguments.py"
    FACTORY = "megatron/training/argument_utils.py"
    ENTRY = "pretrain_gpt.py"

    def __init__(self, repo):
        self.repo = repo
        self.res = Resolver(repo)
        self.ev = Evaluator(self.res, enum_as="name")
        self.flags = {}
        self.sources = set([self.ARGS, self.FACTORY, self.ENTRY])
        self.conditional = []

    def add(self, rec):
        name = rec["name"]
        if name in self.flags:
            old = self.flags[name]
            if old["origin"] != rec["origin"]:
                warn("Megatron flag %s defined twice (%s, %s); keeping the first"
                     % (name, old["origin"], rec["origin"]))
            return
        self.flags[name] = rec
        self.sources.add(rec["origin"].split(":")[0])

    def run(self):
        tree = self.repo.tree(self.ARGS)
        top = find_function(tree, "add_megatron_arguments")
        if top is None:
            raise SystemExit("add_megatron_arguments not found in " + self.ARGS)
        for call in calls_in_order(top):
            if isinstance(call.func, ast.Name):
                fn = find_function(tree, call.func.id)
                if fn is not None:
                    self.parser_function(self.ARGS, fn)
        # extra_args_provider of pretrain_gpt.py
        entry = self.repo.tree(self.ENTRY)
        for call in calls_in_order(entry):
            for kw in call.keywords:
                if kw.arg != "extra_args_provider":
                    continue
                for name in [n for n in ast.walk(kw.value) if isinstance(n, ast.Name)]:
                    hit = self.res.lookup(self.ENTRY, name.id)
                    if hit and hit[0] == "function":
                        self.conditional.append({
                            "function": hit[2].name, "file": hit[1],
                            "condition": ast.unparse(kw.value),
                        })
                        self.parser_function(hit[1], hit[2])
        return self.flags

    def parser_function(self, path, fn):
        imports = function_imports(fn)
        conds = enclosing_conditions(fn)
        for call in calls_in_order(fn):
            func = call.func
            if isinstance(func, ast.Attribute) and func.attr == "add_argument":
                for rec in argparse_records(self.repo, self.res, self.ev, path, call, imports,
                                            condition=conds.get(id(call))):
                    self.add(rec)
            elif isinstance(func, ast.Name) and func.id == "ArgumentGroupFactory":
                self.factory(path, call, imports, fn)

    # -- emulation of ArgumentGroupFactory -----------------------------------
    def local_value(self, fn, node, path, imports, default):
        """Literal value of `node`; a bare name may refer to a local of `fn`."""
        if isinstance(node, ast.Name):
            for stmt in ast.walk(fn):
                if isinstance(stmt, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id == node.id for t in stmt.targets):
                    return self.ev.maybe(stmt.value, path, imports, default)
        return self.ev.maybe(node, path, imports, default)

    def factory(self, path, call, imports, fn):
        if not call.args:
            return
        hit = self.res.resolve_expr(path, call.args[0], imports)
        if not hit or hit[0] != "class":
            warn("cannot resolve dataclass %s in %s:%d"
                 % (ast.unparse(call.args[0]), path, call.lineno))
            return
        cls_path, cls = hit[1], hit[2]
        exclude = []
        for kw in call.keywords:
            if kw.arg == "exclude":
                exclude = self.local_value(fn, kw.value, path, imports, []) or []
        if len(call.args) > 1:
            exclude = self.local_value(fn, call.args[1], path, imports, []) or []
        self.sources.add(cls_path)
        for info in class_fields(self.res, cls_path, cls).values():
            if info.name in exclude or not info.init:
                continue
            self.sources.add(info.path)
            rec = self.field_record(info, cls.name)
            if rec:
                for r in rec:
                    self.add(r)

    def extract_type(self, ts):
        """Mirror of ArgumentGroupFactory._extract_type (raises ValueError)."""
        kind = ts[0]
        if kind == "enum":
            return {"type": "enum", "choices": [n for n, _ in ts[2]]}
        if kind == "name" and ts[1] == "signal.Signals":
            return {"type": "enum", "choices": None}   # stdlib enum, member names
        if kind in ("name", "model"):
            return {"type": ts[1] if kind == "name" else ts[2].name}
        if kind == "none":
            return {"type": "NoneType"}
        if kind == "union":
            if len(ts[1]) >= 2 and ts[1][1][0] == "none":
                return self.extract_type(ts[1][0])
            raise ValueError("union")
        if kind == "list":
            if len(ts[1]) == 1:
                out = self.extract_type(ts[1][0])
                out["nargs"] = "+"
                return out
            raise ValueError("multi-type list")
        if kind == "literal":
            vals = ts[1]
            t = type(vals[0]).__name__ if vals else "str"
            return {"type": t, "choices": list(vals)}
        raise ValueError("unsupported " + str(ts[1] if len(ts) > 1 else ts))

    def field_record(self, info, cls_name):
        path = info.path
        dash = lambda n, prefix=None: "--" + ((prefix + "_" + n) if prefix else n).replace("_", "-")
        names = [dash(info.name)]
        dest = info.name
        if info.default is not MISSING:
            default = self.ev.maybe(info.default, path, (), MISSING)
            if default is MISSING:
                default_known = False
                default = None
            else:
                default_known = True
        elif info.factory is not None:
            try:
                default = self.ev.factory_value(info.factory, path)
                default_known = True
            except NotLiteral:
                default, default_known = None, False
        else:
            default, default_known = None, False
        kwargs = {"type": None, "choices": None, "nargs": None, "action": None}
        ts = ann_struct(self.res, path, info.ann)
        try:
            kwargs.update(self.extract_type(ts))
            if kwargs["type"] == "bool":
                # attribute.default == False decides store_true vs store_false
                is_false = default_known and default == False  # noqa: E712
                kwargs["action"] = "store_true" if is_false else "store_false"
                kwargs["type"] = None
                if kwargs["action"] == "store_false":
                    names = [dash(info.name, "no"), dash(info.name, "disable")]
        except ValueError as exc:
            if info.meta is None:
                warn("%s.%s: type %s not inferable (%s) and no argparse_meta"
                     % (cls_name, info.name, ast.unparse(info.ann), exc))
        meta = {}
        if info.meta is not None:
            for k, v in zip(info.meta.keys, info.meta.values):
                if isinstance(k, ast.Constant):
                    meta[k.value] = v
        if "arg_names" in meta:
            names = self.ev.maybe(meta["arg_names"], path, (), names)
        if "dest" in meta:
            dest = self.ev.maybe(meta["dest"], path, (), dest)
        if "type" in meta:
            t = ast.unparse(meta["type"])
            kwargs["type"] = t
        if "choices" in meta:
            kwargs["choices"] = choices_value(self.ev, self.res, meta["choices"], path)
        if "nargs" in meta:
            kwargs["nargs"] = self.ev.maybe(meta["nargs"], path, (), ast.unparse(meta["nargs"]))
        if "action" in meta:
            kwargs["action"] = self.ev.maybe(meta["action"], path, (), ast.unparse(meta["action"]))
        if "default" in meta:
            default = self.ev.maybe(meta["default"], path, (), None)
        help_text = info.doc
        if "help" in meta:
            help_text = str_value(meta["help"]) or help_text
        action = kwargs["action"]
        takes_value = action not in NO_VALUE_ACTIONS
        t = kwargs["type"]
        type_fn = None
        if action in ("store_true", "store_false"):
            type_name = "bool"
        elif t == "enum":
            type_name = "str"
        elif t in ("int", "float", "str", "bool"):
            type_name = t
        elif t is None:
            type_name = "str" if takes_value else None
        else:
            type_name, type_fn = None, t
        rec_base = {
            "value": takes_value,
            "type": type_name,
            "choices": json_safe(kwargs["choices"]),
            "dest": dest,
            "deprecated": bool(info.deprecated or help_says_deprecated(help_text)),
            "nargs": json_safe(kwargs["nargs"]),
            "default": json_safe(default),
            "action": action,
            "hidden": False,
            "origin": "%s:%d" % (path, info.lineno),
            "generated_from": "%s.%s" % (cls_name, info.name),
        }
        if type_fn:
            rec_base["type_fn"] = type_fn
        out = []
        for n in names:
            rec = {"name": n}
            rec.update(rec_base)
            rec["aliases"] = sorted(x for x in names if x != n)
            out.append(rec)
        return out


def build_megatron(gitdir, rev):
    repo = Repo(gitdir, rev)
    ex = MegatronExtractor(repo)
    flags = ex.run()
    ordered = []
    for name in sorted(flags):
        r = flags[name]
        item = {
            "name": r["name"], "value": r["value"], "type": r["type"],
            "choices": r["choices"], "dest": r["dest"], "deprecated": r["deprecated"],
            "default": r["default"], "nargs": r["nargs"], "action": r["action"],
            "aliases": r["aliases"], "hidden": r["hidden"], "origin": r["origin"],
        }
        for extra in ("type_fn", "generated_from", "negates", "condition"):
            if extra in r:
                item[extra] = r[extra]
        ordered.append(item)
    conditional_files = sorted({c["file"] for c in ex.conditional})
    conditional_flags = sorted(f["name"] for f in ordered
                               if f["origin"].split(":")[0] in conditional_files)
    return {
        "framework": "Megatron-LM",
        "version": repo.version(),
        "commit": repo.commit,
        "commit_date": repo.date,
        "source": sorted(ex.sources | ex.res.used),
        "generated_by": GENERATOR,
        "entry_point": "pretrain_gpt.py",
        "notes": [
            "Flags generated by ArgumentGroupFactory from a config dataclass carry "
            "'generated_from' (Class.field); 'origin' is file:line of the definition.",
            "'value' is false for store_true/store_false/BooleanOptionalAction flags.",
            "'type' is int/float/str/bool or null when a custom converter is used "
            "(named in 'type_fn').",
            "'deprecated' is true when the dest, the help text or a '# deprecated' "
            "comment directly above the definition marks the flag as deprecated "
            "(includes 'Old ... argument, do not use').",
        ],
        "conditional_groups": [
            {"function": c["function"], "file": c["file"], "condition": c["condition"],
             "flags": conditional_flags}
            for c in sorted(ex.conditional, key=lambda c: c["function"])
        ],
        "flags": ordered,
    }


# ---------------------------------------------------------------------------
# torchtitan
# ---------------------------------------------------------------------------

TT_JOB_CONFIG = "torchtitan/config/job_config.py"
TT_MODELS = ["llama3", "llama4", "deepseek_v3", "qwen3"]
TT_PP = "torchtitan/distributed/pipeline_parallel.py"
TT_AC = "torchtitan/distributed/activation_checkpoint.py"

# torch.distributed.pipelining.schedules.get_schedule_class (PyTorch, which is
# not part of the torchtitan tree): name -> single-stage?
TORCH_SCHEDULES = [
    ("1F1B", "Schedule1F1B", True),
    ("Interleaved1F1B", "ScheduleInterleaved1F1B", False),
    ("GPipe", "ScheduleGPipe", True),
    ("LoopedBFS", "ScheduleLoopedBFS", False),
    ("InterleavedZeroBubble", "ScheduleInterleavedZeroBubble", False),
    ("PipelineScheduleSingle", "PipelineScheduleSingle", True),
    ("PipelineScheduleMulti", "PipelineScheduleMulti", False),
    ("ZBVZeroBubble", "ScheduleZBVZeroBubble", False),
    ("DualPipeV", "ScheduleDualPipeV", False),
]


def dataclass_defaults(res, ev, path, cls, _depth=0):
    """{field: default} of a dataclass, nested dataclasses expanded."""
    out = {}
    for info in class_fields(res, path, cls).values():
        if info.name.startswith("_"):
            continue
        out[info.name] = field_default(res, ev, info, _depth)
    return out


def field_default(res, ev, info, _depth=0):
    if info.default is not MISSING:
        return call_or_literal(res, ev, info.path, info.default, _depth)
    if info.factory is not None:
        node = info.factory
        hit = res.resolve_expr(info.path, node) if isinstance(node, (ast.Name, ast.Attribute)) else None
        if hit and hit[0] == "class" and _depth < 10:
            res.used.add(hit[1])
            return dataclass_defaults(res, ev, hit[1], hit[2], _depth + 1)
        try:
            return ev.factory_value(node, info.path)
        except NotLiteral:
            return None
    return None


def call_or_literal(res, ev, path, node, _depth=0):
    if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
        hit = res.resolve_expr(path, node.func)
        if hit and hit[0] == "class" and _depth < 10:
            res.used.add(hit[1])
            vals = dataclass_defaults(res, ev, hit[1], hit[2], _depth + 1)
            for kw in node.keywords:
                if kw.arg:
                    vals[kw.arg] = call_or_literal(res, ev, path, kw.value, _depth + 1)
            return vals
    return ev.maybe(node, path, (), None)


def tt_keys(res, ev, path, cls, prefix, out, sources, _depth=0):
    for info in class_fields(res, path, cls).values():
        name = prefix + info.name
        ts = ann_struct(res, info.path, info.ann)
        base = strip_optional(ts)
        if base[0] == "model" and _depth < 10:
            sources.add(base[1])
            tt_keys(res, ev, base[1], base[2], name + ".", out, sources, _depth + 1)
            continue
        default = field_default(res, ev, info)
        out.append({
            "name": name,
            "type": ast.unparse(info.ann),
            "default": json_safe(default),
            "choices": json_safe(literal_choices(ts)),
            "deprecated": bool(re.match(r"^\W*deprecated\b", info.doc or "", re.I)),
            "origin": "%s:%d" % (info.path, info.lineno),
        })


def tt_flavors(repo, res, ev, sources):
    flavors = {}
    for model in TT_MODELS:
        path = "torchtitan/models/%s/__init__.py" % model
        tree = repo.tree(path)
        if tree is None:
            continue
        for stmt in top_level_statements(tree.body):
            if not (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Dict)):
                continue
            vals = stmt.value.values
            if not vals or not all(isinstance(v, ast.Call) for v in vals):
                continue
            table = {}
            for k, v in zip(stmt.value.keys, vals):
                key = ev.maybe(k, path)
                hit = res.resolve_expr(path, v.func)
                if hit and hit[0] == "class":
                    sources.add(hit[1])
                table[str(key)] = json_safe(call_or_literal(res, ev, path, v))
            sources.add(path)
            flavors[model] = {
                "variable": stmt.targets[0].id if isinstance(stmt.targets[0], ast.Name) else None,
                "flavors": dict(sorted(table.items())),
            }
            break
    return flavors


def tt_pipeline_schedules(repo, sources):
    text = repo.read(TT_PP) or ""
    tree = repo.tree(TT_PP)
    imported = set()
    v_style = []
    if tree is not None:
        sources.add(TT_PP)
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and (n.module or "").endswith("pipelining.schedules"):
                imported.update(a.name for a in n.names)
            if isinstance(n, ast.Compare) and any(isinstance(op, ast.In) for op in n.ops):
                for comp in n.comparators:
                    if isinstance(comp, ast.Tuple) and all(isinstance(e, ast.Name) for e in comp.elts):
                        names = [e.id for e in comp.elts]
                        if names and all(x.startswith("Schedule") for x in names):
                            v_style = names
    items = []
    for name, cls, single in TORCH_SCHEDULES:
        items.append({
            "name": name,
            "class": cls,
            "stages_per_rank": "1" if single else ">=2 (default 2)",
            "looped": not single,
            "v_shape": cls in v_style,
        })
    return {
        "source": "torch.distributed.pipelining.schedules.get_schedule_class (PyTorch); "
                  "names are matched case-insensitively; torchtitan calls it from %s" % TT_PP,
        "case_insensitive": True,
        "csv_override": "parallelism.pipeline_parallel_schedule_csv (a file path) switches to "
                        "_PipelineScheduleRuntime; then pipeline_parallel_schedule must name "
                        "PipelineScheduleSingle or PipelineScheduleMulti",
        "uses_get_schedule_class": "get_schedule_class" in text,
        "names": sorted(i["name"] for i in items),
        "schedules": sorted(items, key=lambda i: i["name"]),
    }


def tt_ac_options(repo, sources):
    tree = repo.tree(TT_AC)
    consts, digit_check = [], False
    if tree is not None:
        sources.add(TT_AC)
        for n in ast.walk(tree):
            if isinstance(n, ast.Compare) and "selective_ac_option" in ast.unparse(n.left):
                for comp in n.comparators:
                    if isinstance(comp, ast.Constant) and isinstance(comp.value, str):
                        if comp.value not in consts:
                            consts.append(comp.value)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) \
                    and n.func.attr == "isdigit" and "selective_ac_option" in ast.unparse(n.func.value):
                digit_check = True
    values = sorted(consts)
    desc = {c: "per-op selective AC (save list policy)" if c == "op" else "" for c in values}
    if digit_check:
        values.append("<N>")
        desc["<N>"] = ("a string of decimal digits: checkpoint every N-th transformer block "
                       "(int(N)); '0' or '1' checkpoints every block")
    return {
        "source": TT_AC,
        "values": values,
        "description": desc,
        "applies_when": "activation_checkpoint.mode == 'selective'",
    }


def build_torchtitan(gitdir, rev):
    repo = Repo(gitdir, rev)
    res = Resolver(repo)
    ev = Evaluator(res, enum_as="value")
    tree = repo.tree(TT_JOB_CONFIG)
    root = find_class(tree, "JobConfig")
    sources = {TT_JOB_CONFIG}
    keys = []
    tt_keys(res, ev, TT_JOB_CONFIG, root, "", keys, sources)
    keys.sort(key=lambda k: k["name"])
    sections = []
    for info in class_fields(res, TT_JOB_CONFIG, root).values():
        ts = strip_optional(ann_struct(res, TT_JOB_CONFIG, info.ann))
        sections.append({"table": info.name,
                         "dataclass": ts[2].name if ts[0] == "model" else ast.unparse(info.ann)})
    flavors = tt_flavors(repo, res, ev, sources)
    schedules = tt_pipeline_schedules(repo, sources)
    ac = tt_ac_options(repo, sources)
    return {
        "framework": "torchtitan",
        "version": repo.version(),
        "commit": repo.commit,
        "commit_date": repo.date,
        "source": sorted(sources | res.used),
        "generated_by": GENERATOR,
        "notes": [
            "Each key 'section.key' is the TOML table [section] entry 'key' (nested "
            "dataclasses give [section.sub] tables) and the CLI flag --section.key.",
            "'type' is the Python annotation text; 'default' is JSON where the default is a "
            "literal (null otherwise or when None).",
        ],
        "sections": sorted(sections, key=lambda x: x["table"]),
        "keys": keys,
        "model_flavors": {m: flavors[m]["flavors"] for m in sorted(flavors)},
        "pipeline_schedules": schedules,
        "selective_ac_options": ac,
    }


# ---------------------------------------------------------------------------
# DeepSpeed
# ---------------------------------------------------------------------------

DS_CONFIG = "deepspeed/runtime/config.py"
DS_INIT = "deepspeed/__init__.py"
DS_DOCS = "docs/_pages/config-json.md"
DS_RUNNER = "deepspeed/launcher/runner.py"
DS_LR = "deepspeed/runtime/lr_schedules.py"
DS_ADAM = ["deepspeed/ops/adam/fused_adam.py", "deepspeed/ops/adam/cpu_adam.py"]
DS_ENGINE = "deepspeed/runtime/engine.py"
PARAM_GETTERS = {"get_scalar_param": "leaf", "get_list_param": "leaf", "get_dict_param": "dict"}


class PathVal:
    """An (abstract) JSON object located at one of `paths` in ds_config."""

    def __init__(self, *paths):
        self.paths = tuple(sorted(set(tuple(p) for p in paths)))

    def child(self, key):
        return PathVal(*[p + (key,) for p in self.paths])

    def merged(self, other):
        return PathVal(*(self.paths + other.paths))


class DictOf:
    """A dict built in code whose entries are JSON objects of ds_config."""

    def __init__(self, entries):
        self.entries = entries


class ConstVal:
    def __init__(self, value):
        self.value = value


class WildKey:
    """A loop variable iterating the (user-chosen) keys of a dict."""


class IterOf:
    def __init__(self, pv, kind):
        self.pv = pv
        self.kind = kind


class DeepSpeedWalker:
    """Follows the ds_config dict through the code that reads it."""

    def __init__(self, repo):
        self.repo = repo
        self.res = Resolver(repo)
        self.ev = Evaluator(self.res, enum_as="value")
        self.keys = {}
        self.sources = set()
        self._done = {}
        self._models_done = set()
        self.depth = 0

    # -- recording ---------------------------------------------------------
    def record(self, path, origin, default=MISSING, type_name=None, choices=None,
               alias_of=None, deprecated=False, model=None, open_object=False,
               legacy_access=None):
        path = tuple(path)
        if not path:
            return
        entry = self.keys.get(path)
        if entry is None:
            entry = {"origins": set(), "default": MISSING, "type": None, "choices": None,
                     "alias_of": None, "deprecated": False, "model": None, "open": False,
                     "legacy_hits": 0, "other_hits": 0}
            self.keys[path] = entry
        entry["origins"].add(origin)
        self.sources.add(origin.split(":")[0])
        if default is not MISSING and entry["default"] is MISSING:
            entry["default"] = default
        if type_name and not entry["type"]:
            entry["type"] = type_name
        if choices is not None and entry["choices"] is None:
            entry["choices"] = choices
        if alias_of and not entry["alias_of"]:
            entry["alias_of"] = alias_of
        if deprecated:
            entry["deprecated"] = True
        if legacy_access is True:
            entry["legacy_hits"] += 1
        elif legacy_access is False:
            entry["other_hits"] += 1
        if model and not entry["model"]:
            entry["model"] = model
        if open_object:
            entry["open"] = True
        # every prefix is an object key as well
        for i in range(1, len(path)):
            parent = path[:i]
            if parent not in self.keys:
                self.keys[parent] = {"origins": {origin}, "default": MISSING, "type": "object",
                                     "choices": None, "alias_of": None, "deprecated": False,
                                     "model": None, "open": False,
                                     "legacy_hits": 0, "other_hits": 0}
            elif not self.keys[parent]["type"]:
                self.keys[parent]["type"] = "object"

    # -- pydantic models -----------------------------------------------------
    def is_model(self, path, cls):
        names = [n.split(".")[-1] for n in self.res.base_names(path, cls)]
        return any(n in ("DeepSpeedConfigModel", "BaseModel") for n in names)

    def attach_model(self, mpath, cls, at):
        key = (mpath, cls.name, tuple(at))
        if key in self._models_done or len(at) > 8:
            return
        self._models_done.add(key)
        self.sources.add(mpath)
        fields = class_fields(self.res, mpath, cls,
                              stop_bases=("DeepSpeedConfigModel", "BaseModel"))
        if at:
            self.record(at, "%s:%d" % (mpath, cls.lineno), type_name="object",
                        model=cls.name)
        for info in fields.values():
            if info.name.startswith("_"):
                continue
            ts = ann_struct(self.res, mpath, info.ann)
            base = strip_optional(ts)
            default = MISSING
            if info.default is not MISSING:
                default = self.ev.maybe(info.default, mpath, (), MISSING)
            elif info.factory is not None:
                try:
                    default = self.ev.factory_value(info.factory, mpath)
                except NotLiteral:
                    default = MISSING
            choices = literal_choices(ts)
            if base[0] == "enum":
                vals = []
                for _, v in base[2]:
                    if v is not MISSING and v not in vals:
                        vals.append(v)
                choices = vals
            origin = "%s:%d" % (mpath, info.lineno)
            names = [(info.name, None)]
            if info.alias:
                names.append((info.alias, info.name))
            deprecated = info.deprecated or help_says_deprecated(info.doc)
            for name, alias_of in names:
                p = tuple(at) + (name,)
                self.record(p, origin, default=default, type_name=json_type_name(ts),
                            choices=choices, alias_of=(".".join(tuple(at) + (alias_of,))
                                                       if alias_of else None),
                            deprecated=deprecated)
                if base[0] == "model" and self.is_model(base[1], base[2]):
                    self.attach_model(base[1], base[2], p)
                elif base[0] == "list" and base[1] and base[1][0][0] == "model" \
                        and self.is_model(base[1][0][1], base[1][0][2]):
                    self.attach_model(base[1][0][1], base[1][0][2], p + ("[]",))

    # -- abstract interpretation ---------------------------------------------
    def run_entry(self, path, fn, bindings, cls_ctx=None, self_attrs=None):
        self.sources.add(path)
        return self.run_function(path, fn, bindings, cls_ctx, self_attrs or {})

    def run_function(self, path, fn, bindings, cls_ctx, self_attrs):
        sig = (path, fn.lineno, fn.name,
               tuple(sorted((k, v.paths) for k, v in bindings.items() if isinstance(v, PathVal))))
        if sig in self._done:
            return self._done[sig]
        if self.depth > 25:
            return None
        self._done[sig] = None
        self.depth += 1
        try:
            ctx = {"path": path, "env": dict(bindings), "cls": cls_ctx, "self": self_attrs,
                   "ret": None, "imports": function_imports(fn),
                   "legacy": "deprecat" in fn.name.lower()}
            self.sources.add(path)
            self.block(fn.body, ctx)
            self._done[sig] = ctx["ret"]
            return ctx["ret"]
        finally:
            self.depth -= 1

    def block(self, stmts, ctx):
        for stmt in stmts:
            self.stmt(stmt, ctx)

    def stmt(self, s, ctx):
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return
        if isinstance(s, ast.Assign):
            val = self.expr(s.value, ctx)
            if val is None and isinstance(s.value, ast.Dict):
                lit = self.ev.maybe(s.value, ctx["path"], ctx["imports"], None)
                if isinstance(lit, dict):
                    val = ConstVal(lit)
            for tgt in s.targets:
                self.bind(tgt, val, s.value, ctx)
            return
        if isinstance(s, ast.AnnAssign) and s.value is not None:
            self.bind(s.target, self.expr(s.value, ctx), s.value, ctx)
            return
        if isinstance(s, ast.Return):
            if s.value is not None:
                val = self.expr(s.value, ctx)
                if isinstance(val, (PathVal, DictOf)) and ctx["ret"] is None:
                    ctx["ret"] = val
            return
        if isinstance(s, (ast.For, ast.AsyncFor)):
            it = self.expr(s.iter, ctx)
            literal_iter = None
            try:
                literal_iter = self.ev.value(s.iter, ctx["path"], ctx["imports"])
            except NotLiteral:
                pass
            if isinstance(literal_iter, list) and all(isinstance(x, str) for x in literal_iter) \
                    and isinstance(s.target, ast.Name):
                for x in literal_iter:
                    ctx["env"][s.target.id] = ConstVal(x)
                    self.block(s.body, ctx)
            else:
                self.bind_loop(s.target, it, ctx)
                if isinstance(it, IterOf) and it.kind == "items":
                    self.copied_defaults(s, it, ctx)
                self.block(s.body, ctx)
            self.block(s.orelse, ctx)
            return
        # generic statement: evaluate contained expressions, then nested blocks
        for field, value in ast.iter_fields(s):
            if isinstance(value, ast.expr):
                self.expr(value, ctx)
            elif isinstance(value, list):
                if value and isinstance(value[0], ast.stmt):
                    self.block(value, ctx)
                else:
                    for v in value:
                        if isinstance(v, ast.expr):
                            self.expr(v, ctx)
                        elif isinstance(v, ast.excepthandler):
                            self.block(v.body, ctx)
                        elif isinstance(v, ast.withitem):
                            self.expr(v.context_expr, ctx)

    def copied_defaults(self, loop, it, ctx):
        """`for k, v in cfg.items(): defaults[k] = v` -- the keys of the literal
        dict `defaults` are the keys expected in `cfg`."""
        if not (isinstance(loop.target, ast.Tuple) and len(loop.target.elts) == 2
                and isinstance(loop.target.elts[0], ast.Name)):
            return
        kvar = loop.target.elts[0].id
        for st in ast.walk(loop):
            if isinstance(st, ast.Assign):
                for tgt in st.targets:
                    if isinstance(tgt, ast.Subscript) and isinstance(tgt.value, ast.Name) \
                            and isinstance(tgt.slice, ast.Name) and tgt.slice.id == kvar:
                        known = ctx["env"].get(tgt.value.id)
                        if isinstance(known, ConstVal) and isinstance(known.value, dict):
                            for key, dflt in known.value.items():
                                if isinstance(key, str):
                                    for p in it.pv.paths:
                                        self.record(p + (key,), self.origin(st, ctx),
                                                    default=dflt, type_name=py_type(dflt))

    def bind(self, tgt, val, node, ctx):
        if isinstance(tgt, ast.Name):
            if isinstance(val, (PathVal, DictOf, ConstVal, WildKey, IterOf)):
                old = ctx["env"].get(tgt.id)
                if isinstance(old, PathVal) and isinstance(val, PathVal):
                    ctx["env"][tgt.id] = old.merged(val)
                elif not (isinstance(old, PathVal) and not isinstance(val, PathVal)):
                    ctx["env"][tgt.id] = val
        elif isinstance(tgt, ast.Attribute) and isinstance(tgt.value, ast.Name) \
                and tgt.value.id == "self":
            if isinstance(val, (PathVal, DictOf)):
                ctx["self"][tgt.attr] = val
        elif isinstance(tgt, (ast.Tuple, ast.List)) and isinstance(node, (ast.Tuple, ast.List)):
            for t, v in zip(tgt.elts, node.elts):
                self.bind(t, self.expr(v, ctx), v, ctx)

    def bind_loop(self, tgt, it, ctx):
        if isinstance(it, IterOf):
            if it.kind == "items" and isinstance(tgt, ast.Tuple) and len(tgt.elts) == 2:
                self.bind(tgt.elts[0], WildKey(), None, ctx)
                self.bind(tgt.elts[1], it.pv.child("*"), None, ctx)
                self.mark_open(it.pv, ctx)
            elif it.kind == "keys":
                self.bind(tgt, WildKey(), None, ctx)
                self.mark_open(it.pv, ctx)
            elif it.kind == "values":
                self.bind(tgt, it.pv.child("*"), None, ctx)
                self.mark_open(it.pv, ctx)
        elif isinstance(it, PathVal):
            self.bind(tgt, WildKey(), None, ctx)
            self.mark_open(it, ctx)

    def mark_open(self, pv, ctx):
        for path in pv.paths:
            if path:
                self.record(path, "%s" % ctx["path"], type_name="object", open_object=True)

    def origin(self, node, ctx):
        return "%s:%d" % (ctx["path"], getattr(node, "lineno", 0))

    def key_of(self, node, ctx):
        """(constant key string | '*' | None, name of the constant used)."""
        val = self.expr(node, ctx)
        const_name = node.id if isinstance(node, ast.Name) else (
            node.attr if isinstance(node, ast.Attribute) else None)
        if isinstance(val, ConstVal) and isinstance(val.value, str):
            return val.value, const_name
        if isinstance(val, WildKey):
            return "*", None
        return None, None

    def access(self, base, key_node, ctx, node, default_node=None, leaf=False):
        if isinstance(base, DictOf):
            k, _ = self.key_of(key_node, ctx)
            return base.entries.get(k)
        if not isinstance(base, PathVal):
            return None
        k, const_name = self.key_of(key_node, ctx)
        if k is None:
            return None
        default = MISSING
        type_name = None
        if default_node is not None:
            default = self.ev.maybe(default_node, ctx["path"], ctx["imports"], MISSING)
            if isinstance(default, dict):
                default = MISSING
                type_name = "object"
        if default is not MISSING and default is not None:
            type_name = py_type(default)
        legacy = ctx.get("legacy") or bool(
            const_name and re.search(r"(_OLD|_DEPRECATED)$", const_name))
        for p in base.paths:
            self.record(p + (k,), self.origin(node, ctx), default=default,
                        type_name=type_name, legacy_access=legacy)
        return base.child(k)

    def call_target(self, func, ctx):
        """Resolve the callee to ('function'|'class'|'method', file, node, cls)."""
        path = ctx["path"]
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
                and func.value.id == "self" and ctx["cls"] is not None:
            cpath, cls = ctx["cls"]
            m = self.find_method(cpath, cls, func.attr)
            if m:
                return ("method", m[0], m[1], (cpath, cls))
            return None
        hit = self.res.resolve_expr(path, func, ctx["imports"])
        if hit and hit[0] in ("function", "class"):
            return (hit[0], hit[1], hit[2], None)
        return None

    def find_method(self, cpath, cls, name, _depth=0):
        for stmt in cls.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == name:
                return (cpath, stmt)
        if _depth < 10:
            for bpath, bcls in self.res.class_bases(cpath, cls):
                m = self.find_method(bpath, bcls, name, _depth + 1)
                if m:
                    return m
        return None

    def bind_args(self, fn, call, ctx, skip_self):
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
        if skip_self and params:
            params = params[1:]
        bindings = {}
        for p, a in zip(params, call.args):
            if isinstance(a, ast.Starred):
                break
            v = self.expr(a, ctx)
            if isinstance(v, (PathVal, DictOf)):
                bindings[p] = v
        kwonly = [a.arg for a in fn.args.kwonlyargs]
        for kw in call.keywords:
            if kw.arg and (kw.arg in params or kw.arg in kwonly):
                v = self.expr(kw.value, ctx)
                if isinstance(v, (PathVal, DictOf)):
                    bindings[kw.arg] = v
        return bindings

    def expr(self, node, ctx):
        if node is None:
            return None
        if isinstance(node, ast.Name):
            if node.id in ctx["env"]:
                return ctx["env"][node.id]
            try:
                v = self.ev.value(node, ctx["path"], ctx["imports"])
                return ConstVal(v)
            except NotLiteral:
                return None
        if isinstance(node, ast.Constant):
            return ConstVal(node.value)
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                return ctx["self"].get(node.attr)
            try:
                return ConstVal(self.ev.value(node, ctx["path"], ctx["imports"]))
            except NotLiteral:
                self.expr(node.value, ctx)
                return None
        if isinstance(node, ast.Subscript):
            base = self.expr(node.value, ctx)
            return self.access(base, node.slice, ctx, node)
        if isinstance(node, ast.Compare):
            left = self.expr(node.left, ctx)
            for op, comp in zip(node.ops, node.comparators):
                right = self.expr(comp, ctx)
                if isinstance(op, (ast.In, ast.NotIn)):
                    target = right
                    if isinstance(right, IterOf):
                        target = right.pv
                    if isinstance(target, PathVal):
                        self.access(target, node.left, ctx, node)
            return None
        if isinstance(node, (ast.BoolOp,)):
            vals = [self.expr(v, ctx) for v in node.values]
            for v in vals:
                if isinstance(v, (PathVal, DictOf)):
                    return v
            return None
        if isinstance(node, ast.IfExp):
            self.expr(node.test, ctx)
            a = self.expr(node.body, ctx)
            b = self.expr(node.orelse, ctx)
            return a if isinstance(a, (PathVal, DictOf)) else b
        if isinstance(node, ast.Dict):
            entries = {}
            for k, v in zip(node.keys, node.values):
                val = self.expr(v, ctx)
                if k is None:
                    if isinstance(val, DictOf):
                        entries.update(val.entries)
                    continue
                kv = self.expr(k, ctx)
                if isinstance(kv, ConstVal) and isinstance(val, PathVal):
                    entries[kv.value] = val
            return DictOf(entries) if entries else None
        if isinstance(node, ast.DictComp) and len(node.generators) == 1:
            gen = node.generators[0]
            try:
                items = self.ev.value(gen.iter, ctx["path"], ctx["imports"])
            except NotLiteral:
                items = None
            if isinstance(items, list) and isinstance(gen.target, ast.Name):
                entries = {}
                saved = ctx["env"].get(gen.target.id)
                for x in items:
                    ctx["env"][gen.target.id] = ConstVal(x)
                    kv = self.expr(node.key, ctx)
                    vv = self.expr(node.value, ctx)
                    if isinstance(kv, ConstVal) and isinstance(vv, PathVal):
                        entries[kv.value] = vv
                if saved is None:
                    ctx["env"].pop(gen.target.id, None)
                else:
                    ctx["env"][gen.target.id] = saved
                return DictOf(entries) if entries else None
        if isinstance(node, ast.Call):
            return self.call(node, ctx)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.expr(child, ctx)
            elif isinstance(child, ast.comprehension):
                self.expr(child.iter, ctx)
                for cond in child.ifs:
                    self.expr(cond, ctx)
        return None

    def call(self, node, ctx):
        func = node.func
        # methods of a config dict
        if isinstance(func, ast.Attribute):
            recv = self.expr(func.value, ctx)
            if isinstance(recv, (PathVal, DictOf)):
                m = func.attr
                if m in ("get", "pop", "setdefault") and node.args:
                    dflt = node.args[1] if len(node.args) > 1 else None
                    return self.access(recv, node.args[0], ctx, node, dflt)
                if m in ("keys", "items", "values") and isinstance(recv, PathVal):
                    return IterOf(recv, m)
                if m == "copy":
                    return recv
        fname = ast.unparse(func).split(".")[-1]
        if fname in PARAM_GETTERS and len(node.args) >= 2:
            base = self.expr(node.args[0], ctx)
            dflt = node.args[2] if len(node.args) > 2 else None
            res = self.access(base, node.args[1], ctx, node, dflt)
            for a in node.args[3:]:
                self.expr(a, ctx)
            return res if PARAM_GETTERS[fname] == "dict" else None
        if fname in ("copy", "deepcopy", "dict") and len(node.args) == 1 and not node.keywords:
            v = self.expr(node.args[0], ctx)
            if isinstance(v, (PathVal, DictOf)):
                return v
        target = self.call_target(func, ctx)
        # Model(**cfg) / Model(cfg)
        if target and target[0] == "class":
            cpath, cls = target[1], target[2]
            star = [k.value for k in node.keywords if k.arg is None]
            if self.is_model(cpath, cls):
                for s in star:
                    v = self.expr(s, ctx)
                    if isinstance(v, PathVal):
                        for p in v.paths:
                            self.attach_model(cpath, cls, p)
                    elif isinstance(v, DictOf):
                        self.attach_model_dictof(cpath, cls, v)
                for a in node.args:
                    self.expr(a, ctx)
                return None
            init = self.find_method(cpath, cls, "__init__")
            if init:
                bindings = self.bind_args(init[1], node, ctx, skip_self=True)
                if bindings:
                    self.run_function(init[0], init[1], bindings, (cpath, cls), {})
                    return None
        if target and target[0] in ("function", "method"):
            fn = target[2]
            bindings = self.bind_args(fn, node, ctx, skip_self=(target[0] == "method"))
            if bindings:
                if target[0] == "method":
                    return self.run_function(target[1], fn, bindings, target[3], ctx["self"])
                return self.run_function(target[1], fn, bindings, None, {})
        for a in node.args:
            self.expr(a.value if isinstance(a, ast.Starred) else a, ctx)
        for k in node.keywords:
            self.expr(k.value, ctx)
        if isinstance(func, ast.Attribute):
            self.expr(func.value, ctx)
        return None

    def attach_model_dictof(self, cpath, cls, dictof):
        fields = class_fields(self.res, cpath, cls, stop_bases=("DeepSpeedConfigModel", "BaseModel"))
        for name, pv in dictof.entries.items():
            info = fields.get(name)
            if info is None:
                continue
            base = strip_optional(ann_struct(self.res, cpath, info.ann))
            for p in pv.paths:
                if base[0] == "model" and self.is_model(base[1], base[2]):
                    self.attach_model(base[1], base[2], p)
                else:
                    self.record(p, "%s:%d" % (cpath, info.lineno))


def py_type(v):
    return {bool: "bool", int: "int", float: "float", str: "str", list: "list",
            dict: "object"}.get(type(v))


def docs_json_paths(text):
    """Key paths that appear in the JSON examples of a markdown page."""
    paths = set()
    for block in re.findall(r"```(?:json|JSON|js|javascript)?[ \t]*\n(.*?)```", text, re.S):
        if '":' not in block and '" :' not in block:
            continue
        toks = re.findall(r'"(?:[^"\\]|\\.)*"|[{}\[\]:,]|[^\s{}\[\]:,"]+', block)
        stack = [("obj", ())]   # implicit root object for fragments
        pending_key = None
        i = 0
        started = False
        while i < len(toks):
            t = toks[i]
            top_kind, top_path = stack[-1]
            if t == "{":
                if pending_key is not None:
                    stack.append(("obj", pending_key))
                elif top_kind == "arr":
                    stack.append(("obj", top_path + ("[]",)))
                elif not started:
                    stack.append(("obj", ()))
                else:
                    stack.append(("obj", top_path))
                pending_key = None
            elif t == "[":
                stack.append(("arr", pending_key if pending_key is not None else top_path))
                pending_key = None
            elif t in ("}", "]"):
                if len(stack) > 1:
                    stack.pop()
                pending_key = None
            elif t.startswith('"') and i + 1 < len(toks) and toks[i + 1] == ":" and top_kind == "obj":
                key = t[1:-1]
                if re.match(r"^[A-Za-z_][A-Za-z0-9_\-]*$", key):
                    pending_key = top_path + (key,)
                    paths.add(pending_key)
                else:
                    pending_key = None
                i += 1
            elif t == ",":
                pending_key = None
            else:
                pending_key = None
            started = True
            i += 1
    return paths


def docs_names(text):
    """Names emphasised as parameter names on the page (***x***, <i>**x**</i>, table cells)."""
    names = set(re.findall(r"\*\*\*([A-Za-z_][A-Za-z0-9_]*)\*\*\*", text))
    names |= set(re.findall(r"<i>\*\*([A-Za-z_][A-Za-z0-9_]*)\*\*</i>", text))
    for row in re.findall(r"^\|\s*([^|]+?)\s*\|", text, re.M):
        cell = row.replace("\\_", "_").strip("*` \"")
        if re.match(r"^[a-z_][a-z0-9_]*$", cell):
            names.add(cell)
    return names


DOC_TYPES = {"integer": "int", "int": "int", "boolean": "bool", "bool": "bool",
             "float": "float", "string": "str", "str": "str", "dictionary": "object",
             "dict": "object", "list": "list", "list of strings": "list"}


def docs_types(text):
    """{name: {type}} from '***name***: [type]' / '<i>**name**</i>: [type]' lines."""
    out = {}
    pat = r"(?:\*\*\*|<i>\*\*)([A-Za-z_][A-Za-z0-9_]*)(?:\*\*\*|\*\*</i>)\s*:\s*\[([^\]]+)\]"
    for name, typ in re.findall(pat, text):
        parts = [DOC_TYPES.get(t.strip().lower()) for t in typ.split("|")]
        if all(parts):
            out.setdefault(name, set()).add("|".join(sorted(set(parts))))
    return out


def rejected_optimizer_params(repo):
    """Params the engine refuses in optimizer.params (`if "x" in params: raise`)."""
    tree = repo.tree(DS_ENGINE)
    out = []
    if tree is None:
        return out
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "_configure_basic_optimizer":
            for st in ast.walk(node):
                if isinstance(st, ast.If) and isinstance(st.test, ast.Compare) \
                        and isinstance(st.test.left, ast.Constant) \
                        and isinstance(st.test.ops[0], ast.In) \
                        and any(isinstance(b, ast.Raise) for b in st.body):
                    out.append((st.test.left.value, st.lineno))
    return out


def signature_params(fn, drop):
    args = fn.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    return [n for n in names if n not in drop]


def signature_defaults(res, ev, path, fn):
    args = fn.args
    pos = args.posonlyargs + args.args
    out = {}
    for a, d in zip(pos[len(pos) - len(args.defaults):], args.defaults):
        out[a.arg] = ev.maybe(d, path, (), None)
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        if d is not None:
            out[a.arg] = ev.maybe(d, path, (), None)
    return out


def ds_optimizer_params(repo, res, ev, sources):
    """Params accepted under optimizer.params for type Adam / AdamW."""
    ctor = {}
    for path in DS_ADAM:
        tree = repo.tree(path)
        if tree is None:
            continue
        for stmt in top_level_statements(tree.body):
            if isinstance(stmt, ast.ClassDef):
                init = next((s for s in stmt.body if isinstance(s, ast.FunctionDef)
                             and s.name == "__init__"), None)
                if init is not None and stmt.name in ("FusedAdam", "DeepSpeedCPUAdam"):
                    sources.add(path)
                    ctor[stmt.name] = (path, init)
    # the engine pops these before constructing the optimizer / passes them itself
    engine_extra = []
    text = repo.read(DS_ENGINE) or ""
    if "TORCH_ADAM_PARAM" in text:
        engine_extra.append("torch_adam")
    if "ADAM_W_MODE" in text:
        engine_extra.append("adam_w_mode")
    if "'fp32_optimizer_states'" in text or '"fp32_optimizer_states"' in text:
        engine_extra.append("fp32_optimizer_states")
    if engine_extra:
        sources.add(DS_ENGINE)
    internal = {"self", "params", "model_params", "adam_w_mode", "adamw_mode",
                "fp32_optimizer_states"}
    per_impl = {}
    defaults = {}
    for cname, (path, init) in sorted(ctor.items()):
        per_impl[cname] = signature_params(init, internal)
        for k, v in signature_defaults(res, ev, path, init).items():
            if k not in internal:
                defaults.setdefault(k, v)
    union = sorted(set(p for ps in per_impl.values() for p in ps) | set(engine_extra))
    entry = {
        "params": union,
        "defaults": json_safe({k: defaults[k] for k in sorted(defaults)}),
        "by_implementation": {k: per_impl[k] for k in sorted(per_impl)},
        "deepspeed_specific": sorted(engine_extra),
        "note": "with torch_adam=true the remaining params go to torch.optim.Adam/AdamW "
                "(torch's constructor arguments); 'max_grad_norm' is rejected, use "
                "gradient_clipping",
    }
    return {"Adam": entry, "AdamW": entry}


def ds_scheduler_params(repo, res, ev, sources):
    tree = repo.tree(DS_LR)
    out = {}
    if tree is None:
        return out
    sources.add(DS_LR)
    valid = []
    for stmt in top_level_statements(tree.body):
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "VALID_LR_SCHEDULES"
                                                for t in stmt.targets):
            valid = ev.maybe(stmt.value, DS_LR, (), []) or []
    for stmt in top_level_statements(tree.body):
        if isinstance(stmt, ast.ClassDef) and stmt.name in valid:
            init = next((s for s in stmt.body if isinstance(s, ast.FunctionDef)
                         and s.name == "__init__"), None)
            if init is None:
                continue
            params = signature_params(init, {"self", "optimizer"})
            defaults = signature_defaults(res, ev, DS_LR, init)
            out[stmt.name] = {
                "params": sorted(params),
                "defaults": json_safe({k: defaults[k] for k in sorted(defaults) if k in params}),
                "origin": "%s:%d" % (DS_LR, init.lineno),
            }
    return dict(sorted(out.items()))


def ds_launcher_flags(repo, res, ev, sources):
    tree = repo.tree(DS_RUNNER)
    fn = find_function(tree, "parse_args")
    sources.add(DS_RUNNER)
    recs = []
    for call in calls_in_order(fn):
        if isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument":
            recs.extend(argparse_records(repo, res, ev, DS_RUNNER, call, (), long_only=False))
    positionals = []
    for call in calls_in_order(fn):
        if isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument" \
                and call.args and (str_value(call.args[0]) or "-").lstrip("-") == str_value(call.args[0]):
            positionals.append(str_value(call.args[0]))
    out = []
    for r in sorted(recs, key=lambda r: r["name"]):
        out.append({k: r[k] for k in ("name", "value", "type", "choices", "dest", "deprecated",
                                       "default", "nargs", "action", "aliases", "origin")
                    if k in r})
    return out, positionals


def build_deepspeed(gitdir, rev):
    repo = Repo(gitdir, rev)
    w = DeepSpeedWalker(repo)
    res, ev = w.res, w.ev
    # entry points: the DeepSpeedConfig class and deepspeed.initialize()
    tree = repo.tree(DS_CONFIG)
    cls = find_class(tree, "DeepSpeedConfig")
    root = PathVal(())
    self_attrs = {"_param_dict": root}
    for stmt in cls.body:
        if isinstance(stmt, ast.FunctionDef):
            bindings = {}
            for a in stmt.args.args[1:]:
                if a.arg in ("param_dict", "config", "ds_config"):
                    bindings[a.arg] = root
            w.run_entry(DS_CONFIG, stmt, bindings, (DS_CONFIG, cls), self_attrs)
    # Getters whose key is a keyword default (config.py: get_communication_data_type(param_dict,
    # comm_type=COMMUNICATION_DATA_TYPE, ...) reads get_scalar_param(param_dict, comm_type, ...)): the
    # default's string is a key.
    for fn in tree.body:
        if not isinstance(fn, ast.FunctionDef) or not fn.args.args or fn.args.args[0].arg != "param_dict":
            continue
        defaults = fn.args.defaults
        named = fn.args.args[len(fn.args.args) - len(defaults):]
        for arg, dflt in zip(named, defaults):
            key = ev.maybe(dflt, DS_CONFIG, (), None)
            if not isinstance(key, str):
                continue
            used = False
            for node in ast.walk(fn):
                if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
                        and node.value.id == "param_dict" and isinstance(node.slice, ast.Name)
                        and node.slice.id == arg.arg):
                    used = True
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        and node.func.id in PARAM_GETTERS and len(node.args) >= 2
                        and isinstance(node.args[1], ast.Name) and node.args[1].id == arg.arg):
                    used = True  # get_scalar_param(param_dict, comm_type, ...)
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "get" and isinstance(node.func.value, ast.Name)
                        and node.func.value.id == "param_dict" and node.args
                        and isinstance(node.args[0], ast.Name) and node.args[0].id == arg.arg):
                    used = True
            if used:
                w.record((key,), "%s:%d" % (DS_CONFIG, fn.lineno))
    init_tree = repo.tree(DS_INIT)
    init_fn = find_function(init_tree, "initialize") if init_tree is not None else None
    if init_fn is not None:
        w.run_entry(DS_INIT, init_fn, {"config": root}, None, {})

    # documentation
    doc_text = repo.read(DS_DOCS) or ""
    doc_paths = docs_json_paths(doc_text)
    doc_names = docs_names(doc_text)
    doc_types = docs_types(doc_text)
    w.sources.add(DS_DOCS)

    # optimizer / scheduler params
    opt = ds_optimizer_params(repo, res, ev, w.sources)
    sched = ds_scheduler_params(repo, res, ev, w.sources)
    optimizer_types = []
    for stmt in top_level_statements(tree.body):
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "DEEPSPEED_OPTIMIZERS"
                                                for t in stmt.targets):
            optimizer_types = ev.maybe(stmt.value, DS_CONFIG, (), []) or []
    impl_file = {"FusedAdam": DS_ADAM[0], "DeepSpeedCPUAdam": DS_ADAM[1]}
    for name in opt["Adam"]["params"]:
        origin = DS_ENGINE
        for impl, params in sorted(opt["Adam"]["by_implementation"].items()):
            if name in params:
                origin = impl_file.get(impl, DS_ADAM[0])
                break
        w.record(("optimizer", "params", name), origin,
                 default=opt["Adam"]["defaults"].get(name, MISSING))
    for sname, info in sched.items():
        for p in info["params"]:
            w.record(("scheduler", "params", p), info["origin"],
                     default=info["defaults"].get(p, MISSING))
    if optimizer_types:
        w.record(("optimizer", "type"), DS_CONFIG, type_name="str")
    if sched:
        w.record(("scheduler", "type"), DS_LR, type_name="str")

    rejected = rejected_optimizer_params(repo)
    for name, line in rejected:
        w.record(("optimizer", "params", name), "%s:%d" % (DS_ENGINE, line))
        w.keys[("optimizer", "params", name)]["rejected"] = True

    # documented keys whose parent is a known object
    known = set(w.keys)
    for p in sorted(doc_paths):
        if p in known or "[]" in p:
            continue
        parent = p[:-1]
        if parent and parent in known and w.keys[parent].get("type") in ("object", None) \
                and not w.keys[parent]["model"] and parent + ("*",) not in known:
            w.record(p, DS_DOCS)
            w.keys[p]["docs_only"] = True

    keys = []
    for p in sorted(w.keys, key=lambda t: ".".join(t)):
        e = w.keys[p]
        name = ".".join(p)
        default = e["default"]
        type_name = e["type"]
        if default is not MISSING and default is not None and not type_name:
            type_name = {bool: "bool", int: "int", float: "float", str: "str",
                         list: "list"}.get(type(default))
        documented = p in doc_paths or (p[-1] in doc_names and p[-1] not in ("*", "[]"))
        if not type_name and documented and len(doc_types.get(p[-1], ())) == 1:
            type_name = next(iter(doc_types[p[-1]]))
        keys.append({
            "name": name,
            "type": type_name,
            "default": json_safe(None if default is MISSING else default),
            "choices": json_safe(e["choices"]),
            "alias_of": e["alias_of"],
            "deprecated": bool(e["deprecated"] or (e["legacy_hits"] and not e["other_hits"])),
            "documented": documented,
            "model": e["model"],
            "open": e["open"],
            "origin": sorted(e["origins"])[0] if e["origins"] else None,
        })
        if e.get("rejected"):
            keys[-1]["rejected"] = True
        if e.get("docs_only"):
            keys[-1]["docs_only"] = True
    choice_overrides = {"optimizer.type": optimizer_types,
                        "scheduler.type": list(sched.keys())}
    for k in keys:
        if k["name"] in choice_overrides and choice_overrides[k["name"]]:
            k["choices"] = choice_overrides[k["name"]]
            # other names are looked up in torch.optim / torch.optim.lr_scheduler
            k["choices_exhaustive"] = False
            k["case_insensitive"] = k["name"] == "optimizer.type"
    launcher, positionals = ds_launcher_flags(repo, res, ev, w.sources)
    undocumented_doc_paths = sorted(".".join(p) for p in doc_paths
                                    if p not in w.keys and "[]" not in p)
    return {
        "framework": "DeepSpeed",
        "version": repo.version(),
        "commit": repo.commit,
        "commit_date": repo.date,
        "source": sorted(s for s in (w.sources | w.res.used) if s and repo.exists(s)),
        "generated_by": GENERATOR,
        "notes": [
            "Key names are JSON paths in ds_config; '*' stands for a user-chosen key "
            "(e.g. a compression group name) and '[]' for list items.",
            "Pydantic models accept both the field name and its alias (populate_by_name); "
            "alias entries carry 'alias_of'. Unknown keys inside pydantic models are "
            "rejected (extra='forbid').",
            "'documented' means the path (or the leaf name) appears in "
            "docs/_pages/config-json.md; 'open' marks objects whose keys the code iterates.",
            "optimizer.type is matched case-insensitively against DeepSpeed's optimizers; "
            "other names are looked up in torch.optim. scheduler.type names a class in "
            "deepspeed/runtime/lr_schedules.py or torch.optim.lr_scheduler.",
        ],
        "keys": keys,
        "optimizer_params": opt,
        "scheduler_params": sched,
        "launcher_flags": launcher,
        "launcher_positionals": positionals,
        "docs_paths_not_in_code": undocumented_doc_paths,
    }


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------

def write_json(path, data):
    text = json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--megatron", default=DEFAULT_MEGATRON)
    ap.add_argument("--megatron-rev", default=DEFAULT_MEGATRON_REV)
    ap.add_argument("--torchtitan", default=DEFAULT_TORCHTITAN)
    ap.add_argument("--torchtitan-rev", default=DEFAULT_TORCHTITAN_REV)
    ap.add_argument("--deepspeed", default=DEFAULT_DEEPSPEED)
    ap.add_argument("--deepspeed-rev", default=DEFAULT_DEEPSPEED_REV)
    repo_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--out-dir", default=os.path.join(repo_root, "resources", "frameworks"),
                    help="output folder (default: resources/frameworks of this checkout)")
    args = ap.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    outputs = [
        ("megatron-lm.json", build_megatron(args.megatron, args.megatron_rev), "flags"),
        ("torchtitan.json", build_torchtitan(args.torchtitan, args.torchtitan_rev), "keys"),
        ("deepspeed.json", build_deepspeed(args.deepspeed, args.deepspeed_rev), "keys"),
    ]
    for fname, data, listname in outputs:
        path = os.path.join(args.out_dir, fname)
        write_json(path, data)
        print("%s: %d %s" % (path, len(data[listname]), listname))
    return 0


if __name__ == "__main__":
    sys.exit(main())
