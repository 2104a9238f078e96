"""Probe a Python environment from inside: Python, platform tags, torch and its GPUs, named packages, and what
transformers' GatedDeltaNet and Mamba-2 modeling modules bound their kernel functions to (nothing is instantiated).

Run with the environment's own interpreter:  python env.py '{"packages": [...], "record_file": "..."}'
where each package is {"distribution": "causal-conv1d", "imports": ["causal_conv1d", "causal_conv1d_cuda"]}.
Prints one JSON object on stdout and exits 0, whatever is missing or broken; failures become fields of the JSON.
Only the standard library is imported at top level (this runs in someone else's environment, any Python >= 3.8).
Broad excepts are the point: whatever fails in that environment is reported, never raised.
Nothing is downloaded: the Hugging Face hub is switched offline before transformers is imported.
One file over 400 lines on purpose: it is copied into and run by another interpreter as a script, so it cannot
use a sibling module; torch and transformers are imported inside the probes that need them, by design.
"""
# ruff: noqa: BLE001

import contextlib
import functools
import importlib
import importlib.util
import json
import logging
import os
import platform
import re
import sys
import sysconfig
import warnings
from importlib import metadata

SCHEMA = 1
ERROR_CHARS = 300  # error texts are cut to this many characters (the last ones: they name the cause)

# The GatedDeltaNet modeling modules of transformers that may exist (names differ across 5.x).
GDN_MODULES = (
    "transformers.models.qwen3_next.modeling_qwen3_next",
    "transformers.models.qwen3_5.modeling_qwen3_5",
    "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
)
# Role → module-level names that hold it, first match wins. transformers <= 5.14 imports the kernel under the role's
# own name (None when unavailable) and keeps a torch_* fallback beside it; 5.15+ decorates the torch function with
# use_kernel_func_from_hub_with_fallback, under the torch function's name.
GDN_ROLES = {
    "causal_conv1d_fn": ("causal_conv1d_fn",),
    "causal_conv1d_update": ("causal_conv1d_update",),
    "chunk_gated_delta_rule": ("chunk_gated_delta_rule", "torch_chunk_gated_delta_rule"),
    "fused_recurrent_gated_delta_rule": ("fused_recurrent_gated_delta_rule", "torch_recurrent_gated_delta_rule"),
}
# Where transformers <= 5.14 falls back when the role's name is None (its layer's __init__ does `x or torch_x`).
OLD_STYLE_FALLBACK = {
    "causal_conv1d_fn": None,  # forward() then runs F.silu(self.conv1d(x)) inline
    "causal_conv1d_update": "torch_causal_conv1d_update",
    "chunk_gated_delta_rule": "torch_chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule": "torch_recurrent_gated_delta_rule",
}
# The Mamba-2 mixers (Mamba2 and the hybrids built on its mixer). transformers 5.15+ decorates the torch function
# with use_kernel_func_from_hub_with_fallback("selective_state_update", "mamba_ssm") etc. under a mamba2_* name;
# older releases import mamba_ssm's and causal_conv1d's functions under their own names (None when unavailable, then
# the mixer's torch_forward runs and is_fast_path_available is False).
MAMBA2_MODULES = (
    "transformers.models.mamba2.modeling_mamba2",
    "transformers.models.bamba.modeling_bamba",
    "transformers.models.falcon_h1.modeling_falcon_h1",
    "transformers.models.granitemoehybrid.modeling_granitemoehybrid",
    "transformers.models.nemotron_h.modeling_nemotron_h",
    "transformers.models.zamba2.modeling_zamba2",
)
MAMBA2_ROLES = {
    "causal_conv1d_fn": ("causal_conv1d_fn",),
    "causal_conv1d_update": ("causal_conv1d_update",),
    "selective_state_update": ("mamba2_selective_state_update", "selective_state_update"),
    "mamba_chunk_scan_combined": ("mamba2_chunk_scan", "mamba_chunk_scan_combined"),
    "mamba_split_conv1d_scan_combined": ("mamba2_split_conv1d_scan_combined", "mamba_split_conv1d_scan_combined"),
}
# family → (modules, roles, fallbacks of old-style None names, how its layer classes end)
FAMILIES = {
    "GatedDeltaNet": (GDN_MODULES, GDN_ROLES, OLD_STYLE_FALLBACK, ("GatedDeltaNet",)),
    "Mamba2": (MAMBA2_MODULES, MAMBA2_ROLES, dict.fromkeys(MAMBA2_ROLES), ("Mixer", "MambaLayer")),
}
KERNEL_PACKAGES = {"causal_conv1d": "causal-conv1d", "fla": "fla-core", "mamba_ssm": "mamba-ssm"}


def short_error(exc):
    text = f"{type(exc).__name__}: {exc}"
    text = " ".join(text.split())
    return text if len(text) <= ERROR_CHARS else "..." + text[-ERROR_CHARS:]


# ---------------------------------------------------------------- Python and platform tags

def glibc_version():
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION")  # "glibc 2.36"
    except (AttributeError, ValueError, OSError):
        return None
    if not text or not text.startswith("glibc "):
        return None
    return text.split()[1]


def computed_tags():
    """The tags packaging.tags.sys_tags() would give a CPython on glibc Linux, for envs without packaging.

    Same set (musllinux and abi3t left out); the order is packaging's before 26.3 (manylinux before linux_*).
    """
    major, minor = sys.version_info[:2]
    interp = f"cp{major}{minor}"
    threaded = "t" if sysconfig.get_config_var("Py_GIL_DISABLED") else ""
    debug = "d" if sysconfig.get_config_var("Py_DEBUG") else ""
    plats = linux_platforms()
    tags = []
    if sys.implementation.name == "cpython":
        abis = [interp + threaded + debug] + ([interp + threaded] if debug else [])
        for abi in abis:
            tags += [f"{interp}-{abi}-{p}" for p in plats]
        if not threaded:
            tags += [f"{interp}-abi3-{p}" for p in plats]
        tags += [f"{interp}-none-{p}" for p in plats]
        if not threaded:
            for m in range(minor - 1, 1, -1):
                tags += [f"cp{major}{m}-abi3-{p}" for p in plats]
    pys = [f"py{major}{minor}", f"py{major}"] + [f"py{major}{m}" for m in range(minor - 1, -1, -1)]
    for py in pys:
        tags += [f"{py}-none-{p}" for p in plats]
    if sys.implementation.name == "cpython":
        tags.append(f"{interp}-none-any")
    tags += [f"{py}-none-any" for py in pys]
    return tags


def linux_platforms():
    plat = re.sub(r"[^\w]", "_", sysconfig.get_platform())  # linux_x86_64
    if not plat.startswith("linux_"):
        return [plat]
    arch = plat[len("linux_"):]
    found = []
    glibc = glibc_version()
    if glibc:
        gmajor, gminor = (int(x) for x in glibc.split(".")[:2])
        oldest = 5 if arch in ("x86_64", "i686") else 17
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
        if gmajor == 2:
            for m in range(gminor, oldest - 1, -1):
                found.append(f"manylinux_2_{m}_{arch}")
                if m in legacy:
                    found.append(f"{legacy[m]}_{arch}")
    return found + [plat]


def platform_tags():
    try:
        from packaging import tags as ptags

        return [str(t) for t in ptags.sys_tags()], "packaging"
    except Exception:
        return computed_tags(), "computed"


def python_info():
    tags, source = platform_tags()
    paths = sysconfig.get_paths()
    return {
        "version": platform.python_version(),
        "minor": "{}.{}".format(*sys.version_info[:2]),
        "executable": sys.executable,
        "implementation": sys.implementation.name,
        "is_venv": sys.prefix != sys.base_prefix,
        "prefix": sys.prefix,
        "base_prefix": sys.base_prefix,
        "purelib": paths["purelib"],
        "platlib": paths["platlib"],
        "machine": platform.machine(),
        "glibc": glibc_version(),
        "tags": tags,
        "tags_source": source,
    }


# ---------------------------------------------------------------- torch

def torch_dependents():
    """The installed distributions that pin torch to a version or range (torchvision: torch==2.14.1): a change of
    torch must move them too. Names with their torch requirement, sorted."""
    found = {}
    for dist in metadata.distributions():
        name = (dist.metadata.get("Name") or "").strip()
        if not name or name.lower() == "torch":
            continue
        for req in dist.requires or []:
            head = req.split(";")[0]
            if ";" not in req and is_torch_requirement(head) and re.search(r"[<>=~!]", head):
                found[name] = head.strip()
    return sorted(f"{name} ({req})" for name, req in found.items())


def torch_info():
    info = {"installed": False, "version": None, "distribution": dist_version("torch"), "cuda": None, "file": None,
            "cuda_available": False, "device_count": 0, "devices": [], "arch_list": [], "error": None,
            "dependents": []}
    try:
        info["dependents"] = torch_dependents()
    except Exception as exc:  # a broken distribution's metadata must not hide the rest
        info["dependents"] = [f"<unreadable: {short_error(exc)}>"]
    try:
        import torch
    except Exception as exc:  # ImportError, but also OSError from a broken libtorch
        info["error"] = short_error(exc)
        info["version"] = dist_version("torch")
        info["installed"] = info["version"] is not None
        return info
    info.update(installed=True, version=str(torch.__version__), cuda=torch.version.cuda, file=torch.__file__)
    try:
        info["cuda_available"] = bool(torch.cuda.is_available())
        info["arch_list"] = list(torch.cuda.get_arch_list())
        if info["cuda_available"]:
            info["device_count"] = torch.cuda.device_count()
            for i in range(info["device_count"]):
                major, minor = torch.cuda.get_device_capability(i)
                info["devices"].append({"index": i, "name": torch.cuda.get_device_name(i),
                                        "capability": [major, minor]})
    except Exception as exc:
        info["error"] = short_error(exc)
    return info


# ---------------------------------------------------------------- named packages

def dist_version(name):
    try:
        return metadata.version(name)
    except Exception:
        return None


def is_torch_requirement(text):
    return re.match(r"^\s*torch\s*(?:[\[(<>=!~;@]|$)", text, re.IGNORECASE) is not None


def package_info(spec, record_file):
    name = spec["distribution"]
    info = {"distribution": name, "installed": False, "version": None, "local": None, "location": None,
            "requires_torch": [], "shared_objects": [], "build_record": None, "build_record_error": None,
            "imports": []}
    try:
        dist = metadata.distribution(name)
    except Exception:
        dist = None
    if dist is not None:
        version = dist.version
        info.update(installed=True, version=version, local=version.split("+", 1)[1] if "+" in version else None)
        info["location"] = str(dist.locate_file(""))
        info["requires_torch"] = [r for r in (dist.requires or []) if is_torch_requirement(r)]
        sos = []
        for f in dist.files or []:
            if re.search(r"\.so(\.\d+)*$", f.name):
                sos.append(os.path.abspath(str(dist.locate_file(f))))
        info["shared_objects"] = sorted(sos)
        text = dist.read_text(record_file) if record_file else None
        if text is not None:
            try:
                info["build_record"] = json.loads(text)
            except ValueError as exc:
                info["build_record_error"] = short_error(exc)
    for mod in spec.get("imports", []):
        info["imports"].append(try_import(mod))
    return info


def try_import(mod):
    with captured() as messages:
        try:
            m = importlib.import_module(mod)
        except BaseException as exc:  # also SystemExit from a package that exits on import
            out = {"module": mod, "ok": False, "file": None, "error": short_error(exc)}
        else:
            out = {"module": mod, "ok": True, "file": getattr(m, "__file__", None), "error": None}
    out["messages"] = list(messages)
    return out


# ---------------------------------------------------------------- transformers' GatedDeltaNet and Mamba-2 kernels

def chosen_implementation(obj):
    """(what a transformers wrapper really calls, the wrapper or None): its closure's ``implementation`` (5.15+).

    functools.wraps points ``__wrapped__`` at the torch function even when the wrapper calls the kernel, so the
    closure is read first; ``__wrapped__`` is followed only through wrappers that have no such closure.
    """
    seen = 0
    while seen < 10:
        seen += 1
        func = kernels_func(obj)
        if func is not None:  # transformers >= 5.25 with the kernels package: an nn.Module around the wrapper
            kernelized = vars(obj).get("forward") if hasattr(obj, "__dict__") else None
            if kernelized is not None:  # kernels.kernelize() swapped in a hub kernel's forward
                return kernelized, obj
            obj = func
            continue
        code = getattr(obj, "__code__", None)
        cells = getattr(obj, "__closure__", None) or ()
        if code is not None and "implementation" in code.co_freevars:
            return cells[code.co_freevars.index("implementation")].cell_contents, obj
        inner = getattr(obj, "__wrapped__", None)
        if inner is None:
            inner = getattr(obj, "func", None) if isinstance(obj, functools.partial) else None
        if inner is None:
            return obj, None
        obj = inner
    return obj, None


def kernels_func(obj):
    """The function that a `kernels` Func module calls by default, else None.

    With the `kernels` package installed, transformers >= 5.25 passes its fallback wrapper through kernels'
    use_kernel_forward_from_hub, which turns a function into an instance of a generated nn.Module class (carrying
    ``kernel_layer_name``) whose forward calls the function from its closure (``func``).
    """
    cls = type(obj)
    forward = getattr(cls, "forward", None)
    code = getattr(forward, "__code__", None)
    if code is None or "func" not in code.co_freevars or not hasattr(cls, "kernel_layer_name"):
        return None
    return forward.__closure__[code.co_freevars.index("func")].cell_contents


def hub_layer_name(value):
    """The name transformers asks the Hugging Face hub for in place of this function (use_kernels=True), else None:
    a Func module's ``kernel_layer_name``, or the ``func_name`` in the fallback wrapper's closure."""
    for _ in range(10):
        name = getattr(type(value), "kernel_layer_name", None)
        if isinstance(name, str):
            return name
        code = getattr(value, "__code__", None)
        cells = getattr(value, "__closure__", None) or ()
        if code is not None and "func_name" in code.co_freevars:
            name = cells[code.co_freevars.index("func_name")].cell_contents
            return name if isinstance(name, str) else None
        inner = kernels_func(value) or getattr(value, "__wrapped__", None)
        if inner is None:
            return None
        value = inner
    return None


def hub_mapping():
    """transformers' own table of hub kernels (layer name -> device -> repository), {} where it has none or the
    kernels package is not usable. Reading it builds LayerRepository objects; nothing is downloaded."""
    try:
        hub = importlib.import_module("transformers.integrations.hub_kernels")
        from transformers.utils import import_utils

        if not import_utils.is_kernels_available():
            return {}
        getter = getattr(hub, "get_kernel_mapping_transformers", None)
        mapping = getter() if getter is not None else getattr(hub, "_KERNEL_MAPPING", {})
        return mapping if isinstance(mapping, dict) else {}
    except Exception:
        return {}


def repo_text(repo):
    """``kernels-community/fla (version 3)`` or ``Atlas-Inference/gdn @531ae679ab5c (remote code)``."""
    repo_id = getattr(repo, "_repo_id", None) or getattr(repo, "repo_id", None) or repr(repo)
    revision, version = getattr(repo, "_revision", None), getattr(repo, "_version", None)
    where = f" (version {version})" if version is not None else (f" @{str(revision)[:12]}" if revision else "")
    remote = " (remote code)" if getattr(repo, "_trust_remote_code", False) else ""
    return f"{repo_id}{where}{remote}"


def device_text(device):
    kind = getattr(device, "type", None) or str(device)
    props = getattr(device, "properties", None)
    low, high = getattr(props, "min_capability", None), getattr(props, "max_capability", None)
    if low is None:
        return kind
    prefix = "sm_" if kind == "cuda" else "capability "
    return f"{kind} {prefix}{low}" if low == high else f"{kind} {prefix}{low}-{high}"


def hub_option(mapping, layer_name):
    """What a model loaded with use_kernels=True would run in place of ``layer_name``: {"layer", "repos", "text"}
    with one repository text per group of devices, or None where transformers maps no hub kernel to it."""
    if not layer_name or layer_name not in mapping:
        return None
    by_repo = {}
    try:
        for device, entry in mapping[layer_name].items():
            repos = list(entry.values()) if isinstance(entry, dict) else [entry]
            for repo in repos:
                by_repo.setdefault(repo_text(repo), [])
                if device_text(device) not in by_repo[repo_text(repo)]:
                    by_repo[repo_text(repo)].append(device_text(device))
    except Exception:
        return None
    repos = [{"repo": r, "devices": d} for r, d in by_repo.items()]
    text = "; ".join(f"{r['repo']} on {', '.join(r['devices'])}" for r in repos)
    return {"layer": layer_name, "repos": repos, "text": text}


def describe(func):
    mod = getattr(func, "__module__", None) or ""
    qual = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
    top = mod.split(".")[0]
    code = getattr(func, "__code__", None)
    source = code.co_filename if code is not None else None
    module_file = getattr(sys.modules.get(mod), "__file__", None)
    if module_file and (source is None or os.path.dirname(source) != os.path.dirname(module_file)):
        source = module_file  # a decorated function's code may live elsewhere (torch.compile's eval_frame.py)
    out = {"module": mod, "qualname": qual, "file": source, "package": None, "package_version": None}
    if top == "transformers":
        out["kind"] = "torch fallback"
        out["text"] = f"torch fallback ({mod}.{qual})"
    elif top == "kernels" or "huggingface" in (source or "") or mod.startswith("hf_kernels"):
        out["kind"] = "hub kernel"
        out["text"] = f"hub kernel ({mod}.{qual} from {source})"
    else:
        dist = owning_distribution(top, source)
        ver = dist_version(dist)
        out.update(kind="kernel", package=dist, package_version=ver)
        out["text"] = "kernel ({} {}: {}.{} from {})".format(dist, ver or "?", mod, qual, source)
    return out


def owning_distribution(top, source):
    """The distribution whose files hold ``source`` (fla: fla-core or flash-linear-attention), else a guess."""
    try:
        candidates = metadata.packages_distributions().get(top, [])
    except Exception:  # Python < 3.10
        candidates = []
    if source:
        real = os.path.realpath(source)
        for name in candidates:
            try:
                dist = metadata.distribution(name)
                files = dist.files or []
            except Exception:
                continue
            if any(os.path.realpath(str(dist.locate_file(f))) == real for f in files):
                return name
    return candidates[0] if candidates else KERNEL_PACKAGES.get(top, top)


def fallback_warning(wrapper, kind):
    """When transformers tells the user about a torch fallback: 5.17+ at the first call, 5.15/5.16 never."""
    if kind != "torch fallback":
        return None
    code = getattr(wrapper, "__code__", None)
    if code is not None and "is_new_implementation" in code.co_freevars:
        return "at first call"
    return "none (silent)"


def classify_role(module, role, family="GatedDeltaNet"):
    _, roles, fallbacks, _ = FAMILIES[family]
    for attr in roles[role]:
        if not hasattr(module, attr):
            continue
        value = getattr(module, attr)
        if value is None:  # transformers <= 5.14: the kernel did not import (or no CUDA); the layer falls back
            fallback = fallbacks.get(role)
            if fallback and getattr(module, fallback, None) is not None:
                out = describe(getattr(module, fallback))
            else:
                inline = ("nn.Conv1d inline in the layer's forward" if family == "GatedDeltaNet"
                          else "the mixer's torch_forward")
                out = {"kind": "torch fallback", "module": module.__name__, "qualname": None, "file": None,
                       "package": None, "package_version": None, "text": f"torch fallback ({inline})"}
            out.update(attribute=attr, wrapper=None, hub=None,
                       fallback_warning="at layer init" if getattr(module, "is_fast_path_available", True) is False
                       else None)
            return out
        impl, wrapper = chosen_implementation(value)
        out = describe(impl)
        out.update(attribute=attr, wrapper="use_kernel_func_from_hub_with_fallback" if wrapper else None,
                   fallback_warning=fallback_warning(wrapper, out["kind"]) if wrapper else None, hub=None)
        return out
    return {"kind": "absent", "attribute": None, "wrapper": None, "fallback_warning": None, "module": None,
            "qualname": None, "file": None, "package": None, "package_version": None, "hub": None,
            "text": "not found (none of {} in {})".format(", ".join(roles[role]), module.__name__)}


class _Collect(logging.Handler):
    def __init__(self):
        logging.Handler.__init__(self, logging.WARNING)
        self.texts = []

    def emit(self, record):
        try:
            self.texts.append(f"{record.name}: {record.getMessage()}")
        except Exception:
            pass


@contextlib.contextmanager
def captured():
    """Collect logging records (WARNING and up, transformers' own logger included) and warnings while inside."""
    handler = _Collect()
    loggers = [logging.getLogger(), logging.getLogger("transformers")]
    for lg in loggers:
        lg.addHandler(handler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield handler.texts
        finally:
            for lg in loggers:
                lg.removeHandler(handler)
            handler.texts.extend(f"{w.category.__name__}: {w.message}" for w in caught)


def hub_kernels_info(transformers):
    info = {"kernels_version": dist_version("kernels"), "usable": False, "enabled_by_env": None}
    try:
        hub = importlib.import_module("transformers.integrations.hub_kernels")
        from transformers.utils import import_utils

        info["usable"] = bool(import_utils.is_kernels_available())
        info["enabled_by_env"] = getattr(hub, "_kernels_enabled", None)
    except Exception as exc:
        info["error"] = short_error(exc)
    info["note"] = "hub kernels replace these functions only in a model loaded with use_kernels=True"
    return info


def transformers_info():
    info = {"installed": False, "version": None, "error": None, "hub_kernels": None, "models": [], "mamba2": [],
            "import_messages": []}
    with captured() as messages:
        try:
            import transformers
        except Exception as exc:
            info["error"] = short_error(exc)
            info["version"] = dist_version("transformers")
            info["installed"] = info["version"] is not None
            info["import_messages"] = list(messages)
            return info
    info.update(installed=True, version=str(transformers.__version__), import_messages=list(messages))
    info["hub_kernels"] = hub_kernels_info(transformers)
    for name in GDN_MODULES:
        info["models"].append(model_info(name))
    for name in MAMBA2_MODULES:
        info["mamba2"].append(model_info(name, "Mamba2"))
    mapping = hub_mapping()  # after the modeling modules: reading it must not change what they bound
    for model in info["models"] + info["mamba2"]:
        add_hub_options(model, mapping)
    try:
        from transformers.utils import import_utils

        info["flash_attention_2"] = flash_attention_info(import_utils)
    except Exception as exc:
        info["flash_attention_2"] = {"error": short_error(exc), "loads": False, "reasons": [short_error(exc)]}
    return info


def add_hub_options(model, mapping):
    """Name, per function and for the layer class itself, the hub kernel use_kernels=True would run instead."""
    module = sys.modules.get(model["module"])
    if module is None or model["error"]:
        return
    for out in model["functions"].values():
        attr = out.get("attribute")
        out["hub"] = hub_option(mapping, hub_layer_name(getattr(module, attr, None))) if attr else None
    model["layer_hub"] = hub_option(mapping, model["layer_class"])


def model_info(name, family="GatedDeltaNet"):
    _, roles, _, layer_suffixes = FAMILIES[family]
    out = {"module": name, "family": family, "exists": False, "error": None, "layer_class": None, "functions": {},
           "layer_hub": None,
           "is_fast_path_available": None, "fast_path": None, "import_messages": []}
    try:
        if importlib.util.find_spec(name) is None:
            return out
    except Exception:  # a parent package missing
        return out
    out["exists"] = True
    with captured() as messages:
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            out["error"] = short_error(exc)
            module = None
    out["import_messages"] = list(messages)
    if module is None:
        return out
    layers = [k for k, v in vars(module).items() if isinstance(v, type) and k.endswith(layer_suffixes)
              and getattr(v, "__module__", None) == name]
    out["layer_class"] = layers[0] if layers else None
    for role in roles:
        out["functions"][role] = classify_role(module, role, family)
    flag = getattr(module, "is_fast_path_available", None)
    out["is_fast_path_available"] = flag if isinstance(flag, bool) else None
    out["fast_path"] = all(f["kind"] in ("kernel", "hub kernel") for f in out["functions"].values())
    return out


# ---------------------------------------------------------------- attn_implementation="flash_attention_2"

FA2_MIN = (2, 3, 3)  # transformers 5.x is_flash_attn_2_available(): flash_attn >= 2.3.3


def version_tuple(text):
    return tuple(int(x) for x in re.findall(r"\d+", (text or "").split("+")[0])[:3])


def flash_attention_info(import_utils):
    """Would transformers' attn_implementation="flash_attention_2" load and run the installed flash-attn, and if
    not, every reason why: transformers' own check (is_flash_attn_2_available) and what it does not check (the
    extension importing, the GPU being sm_80+, the head dims a subset build carries)."""
    out = {"transformers_says": None, "kernels_fallback": None, "version": dist_version("flash_attn"),
           "distributions": [], "built_head_dims": None, "loads": False, "reasons": [], "error": None}
    reasons = out["reasons"]
    try:
        out["transformers_says"] = bool(import_utils.is_flash_attn_2_available())
    except Exception as exc:
        out["error"] = short_error(exc)
    try:  # transformers 5.2x: kernels' hub build of FA2 when flash-attn is missing (kernels-community/flash-attn2)
        out["kernels_fallback"] = bool(import_utils.is_flash_attn_2_available(kernels_fallback_ok=True))
    except Exception:
        pass
    if out["version"] is None:
        reasons.append("flash-attn is not installed")
        return out
    mapping = getattr(metadata, "packages_distributions", None)
    try:
        out["distributions"] = sorted(mapping().get("flash_attn", [])) if mapping else []
    except Exception:
        pass
    if out["distributions"] and "flash-attn" not in [d.lower().replace("_", "-") for d in out["distributions"]]:
        reasons.append("flash_attn comes from {} (transformers takes only the flash-attn distribution as FA2)"
                       .format(", ".join(out["distributions"])))
    if version_tuple(out["version"]) < FA2_MIN:
        reasons.append("flash-attn {} is older than 2.3.3, the oldest transformers accepts".format(out["version"]))
    try:
        import torch

        if not torch.cuda.is_available():
            reasons.append(f"torch {torch.__version__} sees no CUDA GPU" if torch.version.cuda
                           else f"torch {torch.__version__} is a CPU build")
        else:
            old = [f"{torch.cuda.get_device_name(i)} (sm_{a}{b})" for i in range(torch.cuda.device_count())
                   for a, b in [torch.cuda.get_device_capability(i)] if a < 8]
            if old:
                reasons.append("FlashAttention 2 runs on sm_80 and newer only: " + ", ".join(old))
    except Exception as exc:
        reasons.append(f"torch fails to import: {short_error(exc)}")
    with captured():
        try:
            ext = importlib.import_module("flash_attn_2_cuda")
            dims = getattr(ext, "built_head_dims", None)
            out["built_head_dims"] = sorted(int(d) for d in dims) if dims is not None else None
        except BaseException as exc:
            reasons.append(f"flash_attn_2_cuda fails to import: {short_error(exc)}")
    if out["transformers_says"] is False and not reasons:
        reasons.append("transformers' is_flash_attn_2_available() says no")
    out["loads"] = bool(out["transformers_says"]) and not reasons
    return out


# ---------------------------------------------------------------- main

def collect(spec):
    report = {"schema": SCHEMA, "python": None, "torch": None, "packages": [], "transformers": None, "errors": []}
    sections = [
        ("python", python_info),
        ("torch", torch_info),
        ("packages", lambda: [package_info(p, spec.get("record_file")) for p in spec.get("packages", [])]),
        ("transformers", transformers_info),
    ]
    for key, fn in sections:
        try:
            report[key] = fn()
        except BaseException as exc:  # a probe bug or a hostile package: keep the other sections
            report["errors"].append(f"{key}: {short_error(exc)}")
    return report


def main(argv):
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    # Whatever imported code prints (Python or C level) goes to stderr; stdout carries only the JSON.
    sys.stdout.flush()
    json_fd = os.dup(1)
    os.dup2(2, 1)
    try:
        spec = json.loads(argv[1]) if len(argv) > 1 else {}
        report = collect(spec)
    except BaseException as exc:
        report = {"schema": SCHEMA, "errors": [f"probe: {short_error(exc)}"]}
    sys.stdout.flush()
    data = (json.dumps(report, default=str) + "\n").encode()
    with open(json_fd, "wb", closefd=True) as out:
        out.write(data)
    return 0


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: a broken extension can crash at exit after the JSON is out
