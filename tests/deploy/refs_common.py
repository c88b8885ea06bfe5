"""The programs' flags (from their --help), image names and small helpers
shared by the deployment reference checks (check_references.py)."""
import os
import re
import shlex
import subprocess

import yaml


PROGRAMS = ("shardtrain", "shardtrain-coordinator", "shardtrain-worker")
OUR_IMAGES = ("shardtrain", "shardtrain-cuda")
IMAGE_UID = 10001


# ---------------------------------------------------------------------------
# The programs' flags, from --help (CLI11's format).

class Usage:
    """One program's (or subcommand's) options and positionals."""

    def __init__(self, text):
        self.options = {}        # name -> {"value": bool, "type": str, "repeat": bool}
        self.required = set()    # option names that are REQUIRED
        self.positionals = []    # [(name, required, repeat)]
        self.subcommands = set()
        section = None
        for line in text.splitlines():
            if re.match(r"^(Options|Positionals|Subcommands):", line):
                section = line.split(":")[0]
                continue
            if not line.startswith("  ") or line.startswith("   "):
                continue  # a wrapped description
            head = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
            parts = head.split()
            if section == "Options" and parts[0].startswith("-"):
                names = parts[0].split(",")
                rest = " ".join(parts[1:])
                typ = parts[1] if len(parts) > 1 and re.match(r"^[A-Z]", parts[1]) else ""
                spec = {"value": bool(typ), "type": rest, "repeat": "..." in parts}
                for n in names:
                    self.options[n] = spec
                    if "REQUIRED" in parts:
                        self.required.add(names[-1])
            elif section == "Positionals":
                self.positionals.append((parts[0], "REQUIRED" in parts, "..." in parts))
            elif section == "Subcommands":
                self.subcommands.add(parts[0])


class Programs:
    def __init__(self, bin_dir):
        self.bin_dir = bin_dir
        self.cache = {}

    def usage(self, program, sub=None):
        key = (program, sub)
        if key not in self.cache:
            argv = [os.path.join(self.bin_dir, program)] + ([sub] if sub else []) + ["--help"]
            out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            if out.returncode != 0:
                raise RuntimeError(f"{' '.join(argv)} exited {out.returncode}: {out.stderr}")
            self.cache[key] = Usage(out.stdout)
        return self.cache[key]

    def parse(self, argv):
        """Returns (program, subcommand, {option: value}, [positionals], [problems])."""
        problems = []
        program = os.path.basename(argv[0])
        args = list(argv[1:])
        sub = None
        if program == "shardtrain":
            top = self.usage(program)
            if not args or args[0] not in top.subcommands:
                return program, None, {}, [], [f"shardtrain: no known subcommand in {args[:1]} "
                                               f"({', '.join(sorted(top.subcommands))})"]
            sub = args.pop(0)
        usage = self.usage(program, sub)
        values, positionals = {}, []
        name = f"{program} {sub}" if sub else program
        i = 0
        while i < len(args):
            a = args[i]
            i += 1
            if a.startswith("-") and len(a) > 1:
                flag, eq, val = a.partition("=")
                spec = usage.options.get(flag)
                if spec is None:
                    problems.append(f"{name}: unknown flag {flag} (has {', '.join(sorted(o for o in usage.options if o.startswith('--')))})")
                    continue
                canonical = next(o for o, s in usage.options.items() if s is spec and o.startswith("--")) \
                    if not flag.startswith("--") else flag
                if spec["value"]:
                    if not eq:
                        if i >= len(args) or args[i].startswith("--"):
                            problems.append(f"{name}: {flag} needs a value")
                            continue
                        val = args[i]
                        i += 1
                    problems += check_value(name, flag, spec["type"], val)
                    values[canonical] = val
                else:
                    if eq:
                        problems.append(f"{name}: {flag} takes no value")
                    values[canonical] = True
            else:
                positionals.append(a)
        for req in usage.required:
            if req not in values:
                problems.append(f"{name}: required option {req} missing")
        wanted = [p for p in usage.positionals if p[1]]
        if len(positionals) < len(wanted):
            problems.append(f"{name}: missing positional {wanted[len(positionals)][0]}")
        if not any(p[2] for p in usage.positionals) and len(positionals) > len(usage.positionals):
            problems.append(f"{name}: unexpected argument(s) {positionals[len(usage.positionals):]}")
        return program, sub, values, positionals, problems


def check_value(name, flag, typ, val):
    if "$(" in val or "${" in val:  # filled in at run time (shell or Kubernetes)
        return []
    m = re.match(r"^INT(?::INT in \[(-?\d+) - (-?\d+)\])?", typ)
    if m:
        if not re.fullmatch(r"-?\d+", val):
            return [f"{name}: {flag} {val!r} is not an integer"]
        if m.group(1) and not int(m.group(1)) <= int(val) <= int(m.group(2)):
            return [f"{name}: {flag} {val} outside [{m.group(1)}, {m.group(2)}]"]
    m = re.match(r"^TEXT:\{([^}]*)\}", typ)
    if m and val not in m.group(1).split(","):
        return [f"{name}: {flag} {val!r} is not one of {m.group(1)}"]
    return []


def port_of(address):
    """'0.0.0.0:9091' -> 9091; None if there is no numeric port."""
    m = re.search(r":(\d+)$", address or "")
    return int(m.group(1)) if m else None


def command_lines(argv):
    """The shardtrain command lines in a container's argv: the argv itself, or
    the commands of a `sh -c SCRIPT` (after `exec`, up to a shell operator)."""
    if not argv:
        return []
    if os.path.basename(argv[0]) in ("sh", "bash") and len(argv) >= 3 and argv[1] == "-c":
        # A command substitution, quoted or not, is one word to the shell.
        script = re.sub(r'"?\$\([^()]*\)"?', "$(SUBST)", argv[2])
        tokens = shlex.split(script, posix=True)
        lines, cur = [], None
        for t in tokens:
            if t in ("&&", "||", ";", "|") or t.startswith((">", "<", "2>")) or t.endswith(";"):
                if cur:
                    lines.append(cur)
                cur = None
                continue
            if cur is None and os.path.basename(t) in PROGRAMS:
                cur = [t]
            elif cur is not None:
                cur.append(t)
        if cur:
            lines.append(cur)
        return lines
    return [argv] if os.path.basename(argv[0]) in PROGRAMS else []


def spec_world(path):
    with open(path) as f:
        spec = yaml.safe_load(f)
    par = spec.get("parallel") or {}
    world = int(par.get("dp", 1)) * int(par.get("tp", 1)) * int(par.get("pp", 1))
    device = (spec.get("resources") or {}).get("device", "cpu")
    return world, device


def image_repo_tag(image):
    """'prom/prometheus:v3.5.0' -> ('prom/prometheus', 'v3.5.0'); digest -> tag '@...'."""
    if "@" in image:
        return image.split("@")[0].rsplit(":", 1)[0], "@" + image.split("@")[1]
    last = image.rsplit("/", 1)[-1]
    if ":" in last:
        repo, tag = image.rsplit(":", 1)
        return repo, tag
    return image, None


def check_image(where, image):
    repo, tag = image_repo_tag(image)
    if not tag:
        return [f"{where}: image {image} has no tag (means latest)"]
    if tag == "latest":
        return [f"{where}: image {image} is not pinned"]
    return []


def etcd_flags(argv):
    """etcd's command line as {--flag: value}, from --flag=value or --flag value."""
    flags, i = {}, 1
    while i < len(argv):
        a = argv[i]
        i += 1
        if a.startswith("--"):
            k, eq, v = a.partition("=")
            if not eq and i < len(argv) and not argv[i].startswith("--"):
                v = argv[i]
                i += 1
            flags[k] = v
    return flags
