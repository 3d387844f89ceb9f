#!/usr/bin/env node
// Offline validation of deploy/kubernetes (tests/deploy/CMakeLists.txt runs it; ctest label
// `deploy`). For every document of every .yaml file under the folder:
//   1. parse with `yaml` (syntax errors, duplicate keys);
//   2. Kustomization files: every `resources` entry exists, and every manifest of the tree is
//      listed by some kustomization (nothing silently left out of `kubectl apply -k`);
//   3. any other document: its apiVersion/kind must name a typed model of `kubernetes-models`
//      (the Kubernetes 1.34 OpenAPI schema) -> `.validate()` (types, enums, required fields);
//   4. strict fields: the OpenAPI schema allows unknown fields (the API server rejects them only
//      under strict field validation), so the object is also walked along the model's TypeScript
//      declarations (.d.ts, generated from the same schema) and every field they do not declare
//      is an error; this is what catches a typo such as `tolerration:`;
//   5. project rules on the parsed objects (projectRules below; those of rl/, the MoE RL run, in
//      validate_k8s_rl.mjs).
// Then a negative self-test: each folder under tests/deploy/broken/k8s overlays the real tree
// (its files replace or add to deploy/kubernetes, same relative paths) and MUST fail with an
// error containing the text of its EXPECT file, so the validator cannot pass vacuously.
//
//   node tests/deploy/validate_k8s.mjs            the real tree, then the self-test
//   node tests/deploy/validate_k8s.mjs DIR        only DIR (a deploy/kubernetes-like folder)
// Exit status: 0 all good, 1 a check failed, 2 usage or setup error.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import YAML from "yaml";
import { rlRules } from "./validate_k8s_rl.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "../..");
// The packages are ESM with "import"-only exports: resolve through import.meta.resolve.
const resolveFile = (spec) => fileURLToPath(import.meta.resolve(spec));

// The daemon's defaults (common/params.cpp) for parameters the config may omit.
const DEFAULT_SOCKET = "/run/proxyep/proxyepd.sock";
const DEFAULT_DRAIN_MS = 10000;
// terminationGracePeriodSeconds must exceed the drain deadline by this much (process exit).
const GRACE_MARGIN_S = 5;

// ---------------------------------------------------------------- loading a tree of manifests
// files: Map relative path -> text. The real tree, or the real tree with an overlay on top.
function readTree(dir, base = dir, out = new Map()) {
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    const full = path.join(dir, entry.name);
    if (entry.isDirectory()) readTree(full, base, out);
    else if (/\.ya?ml$/.test(entry.name)) out.set(path.relative(base, full), fs.readFileSync(full, "utf8"));
  }
  return out;
}

// ---------------------------------------------------------------- typed models
const modelCache = new Map();
async function modelFor(apiVersion, kind) {
  if (typeof apiVersion !== "string" || typeof kind !== "string" || !/^[A-Z][A-Za-z0-9]*$/.test(kind))
    return null;
  const spec = `kubernetes-models/${apiVersion}/${kind}`;
  if (!modelCache.has(spec)) {
    let found = null;
    try {
      const mod = await import(spec);
      const cls = mod[kind];
      // Only top-level resources carry a static kind (v1/Container is a model, not a kind).
      if (cls && cls.kind === kind && cls.apiVersion === apiVersion) {
        found = { cls, dts: resolveFile(spec).replace(/\.js$/, ".d.ts") };
      }
    } catch {
      found = null;
    }
    modelCache.set(spec, found);
  }
  return modelCache.get(spec);
}

// ---------------------------------------------------------------- strict fields from .d.ts
// The generated declarations are regular: `import { IIoK8s... } from "./X.js";` lines, then
// `export interface IName [extends TypeMeta] { "field"?: Type; ... }`.
const dtsCache = new Map();
function parseDts(file) {
  if (dtsCache.has(file)) return dtsCache.get(file);
  const text = fs.readFileSync(file, "utf8").replace(/\/\*[\s\S]*?\*\//g, "");
  const imports = new Map();
  for (const m of text.matchAll(/import \{ (\w+) \} from "([^"]+)";/g)) {
    const spec = m[2];
    const target = spec.startsWith(".")
      ? path.resolve(path.dirname(file), spec.replace(/\.js$/, ".d.ts"))
      : resolveFile(spec).replace(/\.js$/, ".d.ts");
    imports.set(m[1], target);
  }
  let props = null;
  const start = text.search(/export interface \w+[^{]*\{/);
  if (start >= 0) {
    props = new Map();
    let i = text.indexOf("{", start) + 1, depth = 0, seg = "";
    for (; i < text.length; i++) {
      const c = text[i];
      if (c === "{" || c === "<") depth++;
      if (c === "}" || c === ">") {
        if (depth === 0 && c === "}") break;
        depth--;
      }
      if (c === ";" && depth === 0) {
        const m = seg.match(/^\s*"([^"]+)"\??\s*:\s*([\s\S]*)$/);
        if (m) props.set(m[1], m[2].trim());
        seg = "";
      } else seg += c;
    }
  }
  const parsed = { imports, props };
  dtsCache.set(file, parsed);
  return parsed;
}

function walkType(value, type, ctx, where, errors) {
  let m;
  if ((m = type.match(/^Array<(\w+)>$/))) {
    if (Array.isArray(value)) value.forEach((v, i) => walkType(v, m[1], ctx, `${where}[${i}]`, errors));
  } else if ((m = type.match(/^\{\s*\[key: string\]:\s*(\w+);?\s*\}$/))) {
    if (value && typeof value === "object")
      for (const [k, v] of Object.entries(value)) walkType(v, m[1], ctx, `${where}.${k}`, errors);
  } else if (ctx.imports.has(type)) {
    walkObject(value, ctx.imports.get(type), where, errors);
  }
}

function walkObject(value, dtsFile, where, errors) {
  if (!value || typeof value !== "object" || Array.isArray(value)) return;
  const ctx = parseDts(dtsFile);
  if (!ctx.props) return; // an opaque type (Quantity, IntOrString, Time, ...)
  for (const [key, v] of Object.entries(value)) {
    const type = ctx.props.get(key);
    if (type === undefined) errors.push(`unknown field ${where ? where + "." : ""}${key}`);
    else walkType(v, type, ctx, where ? `${where}.${key}` : key, errors);
  }
}

// ---------------------------------------------------------------- the checks
async function validateTree(files, label) {
  const errors = [];
  const err = (where, msg) => errors.push(`${label}/${where}: ${msg}`);
  const objects = []; // { file, index, obj }
  const kustomizations = [];

  for (const [file, text] of [...files.entries()].sort()) {
    const docs = YAML.parseAllDocuments(text, { uniqueKeys: true, prettyErrors: true });
    for (const [i, doc] of docs.entries()) {
      const where = `${file} document ${i + 1}`;
      if (doc.errors.length) {
        for (const e of doc.errors) err(where, `YAML: ${e.message}`);
        continue;
      }
      const obj = doc.toJS();
      if (obj === null || obj === undefined) continue; // an empty document (comments only)
      if (typeof obj !== "object" || Array.isArray(obj)) {
        err(where, "not a mapping");
        continue;
      }
      const name = `${obj.kind ?? "?"}/${obj.metadata?.name ?? "?"}`;
      if (obj.kind === "Kustomization") {
        kustomizations.push({ file, where, obj });
        continue;
      }
      const model = await modelFor(obj.apiVersion, obj.kind);
      if (!model) {
        err(where, `unknown kind: apiVersion ${JSON.stringify(obj.apiVersion)}, kind ${JSON.stringify(obj.kind)} names no Kubernetes resource`);
        continue;
      }
      try {
        new model.cls(obj).validate();
      } catch (e) {
        err(`${where} (${name})`, `schema: ${e.message}`);
      }
      const unknown = [];
      walkObject(obj, model.dts, "", unknown);
      for (const u of unknown) err(`${where} (${name})`, `schema: ${u}`);
      objects.push({ file, where: `${where} (${name})`, obj });
    }
  }

  // Kustomizations: resources exist; every manifest is reachable from one.
  const listed = new Set();
  const allowedKeys = new Set(["apiVersion", "kind", "metadata", "resources", "images", "namespace",
    "commonLabels", "labels", "commonAnnotations", "patches", "configMapGenerator", "secretGenerator",
    "generatorOptions", "components", "replicas", "nameSuffix", "namePrefix"]);
  if (!kustomizations.some((k) => path.dirname(k.file) === "."))
    err("kustomization.yaml", "missing: the folder must apply as one unit (kubectl apply -k)");
  for (const { file, where, obj } of kustomizations) {
    if (obj.apiVersion !== "kustomize.config.k8s.io/v1beta1")
      err(where, `Kustomization apiVersion must be kustomize.config.k8s.io/v1beta1, not ${obj.apiVersion}`);
    for (const key of Object.keys(obj)) if (!allowedKeys.has(key)) err(where, `unknown Kustomization field ${key}`);
    if (!Array.isArray(obj.resources) || obj.resources.length === 0) err(where, "resources: empty");
    for (const res of obj.resources ?? []) {
      const rel = path.normalize(path.join(path.dirname(file), String(res)));
      const isDir = [...files.keys()].some((f) => f.startsWith(rel + path.sep));
      if (files.has(rel)) listed.add(rel);
      else if (isDir && files.has(path.join(rel, "kustomization.yaml"))) listed.add(path.join(rel, "kustomization.yaml"));
      else err(where, `resources entry ${JSON.stringify(res)} does not exist`);
    }
  }
  for (const file of files.keys()) {
    if (path.basename(file) === "kustomization.yaml") continue;
    if (!listed.has(file)) err(file, "not listed in any kustomization.yaml resources (it would never be applied)");
  }

  projectRules(objects, (where, msg) => err(where, `rule: ${msg}`));
  rlRules(objects, repo, (where, msg) => err(where, `rule: ${msg}`));
  return errors;
}

// ---------------------------------------------------------------- project rules
function podSpecOf(obj) {
  if (obj.kind === "Pod") return obj.spec;
  if (obj.kind === "CronJob") return obj.spec?.jobTemplate?.spec?.template?.spec;
  return obj.spec?.template?.spec;
}
const argAfter = (cmd, flag) => {
  const i = cmd.indexOf(flag);
  return i >= 0 && i + 1 < cmd.length ? String(cmd[i + 1]) : undefined;
};
const isStatusProbe = (probe, socket) => {
  const cmd = probe?.exec?.command;
  return Array.isArray(cmd) && path.basename(String(cmd[0])) === "proxyep" && cmd[1] === "status" &&
    argAfter(cmd, "--socket") === socket;
};
const mountFor = (spec, container, dir) => {
  const m = (container.volumeMounts ?? []).find((vm) => path.normalize(vm.mountPath) === dir);
  const vol = m && (spec.volumes ?? []).find((v) => v.name === m.name);
  return { mount: m, volume: vol };
};

function projectRules(objects, fail) {
  const byKind = (kind) => objects.filter((o) => o.obj.kind === kind);
  const daemonSets = byKind("DaemonSet").filter((o) => o.obj.metadata?.name === "proxyepd");
  if (daemonSets.length !== 1) {
    fail("DaemonSet/proxyepd", `expected exactly one DaemonSet named proxyepd, found ${daemonSets.length}`);
    return;
  }
  const { where, obj: ds } = daemonSets[0];
  const ns = ds.metadata?.namespace;
  const spec = ds.spec?.template?.spec ?? {};
  const container = (spec.containers ?? []).find((c) => c.name === "proxyepd");
  if (!container) return fail(where, "no container named proxyepd");
  const cmd = [...(container.command ?? []), ...(container.args ?? [])].map(String);
  if (path.basename(cmd[0] ?? "") !== "proxyepd") fail(where, "the proxyepd container must run proxyepd");

  // Same namespace for what the DaemonSet references.
  for (const kind of ["Namespace", "ServiceAccount", "ConfigMap"]) {
    const needed = kind === "Namespace" ? ns : kind === "ServiceAccount" ? spec.serviceAccountName : undefined;
    if (needed && !objects.some((o) => o.obj.kind === kind && o.obj.metadata?.name === needed &&
        (kind === "Namespace" || o.obj.metadata?.namespace === ns)))
      fail(where, `${kind} ${needed} is not defined in these manifests`);
  }

  // The config: --config FILE must be a key of a mounted ConfigMap; its JSON must parse and name
  // only parameters the registry knows (common/params.cpp), or proxyepd refuses to start.
  let config = {};
  const configPath = argAfter(cmd, "--config");
  if (!configPath) fail(where, "proxyepd must get --config (the ConfigMap's JSON)");
  else {
    const { mount, volume } = mountFor(spec, container, path.dirname(configPath));
    const cmName = volume?.configMap?.name;
    const cm = objects.find((o) => o.obj.kind === "ConfigMap" && o.obj.metadata?.name === cmName &&
      o.obj.metadata?.namespace === ns);
    const text = cm?.obj.data?.[path.basename(configPath)];
    if (!mount || !cm || text === undefined)
      fail(where, `--config ${configPath} is not a key of a ConfigMap mounted at ${path.dirname(configPath)}`);
    else {
      try {
        config = JSON.parse(text);
        if (!config || typeof config !== "object" || Array.isArray(config)) throw new Error("not a JSON object");
      } catch (e) {
        fail(cm.where, `${path.basename(configPath)}: invalid JSON config: ${e.message}`);
        config = {};
      }
      const known = knownParameters();
      if (known)
        for (const key of Object.keys(config))
          if (!known.has(key)) fail(cm.where, `${path.basename(configPath)}: unknown parameter ${key} (common/params.cpp)`);
    }
  }

  // The socket: --socket, else daemon.socket of the config, else the default.
  const socket = argAfter(cmd, "--socket") ?? config["daemon.socket"] ?? DEFAULT_SOCKET;
  const socketDir = path.dirname(socket);
  const { volume: sockVol } = mountFor(spec, container, socketDir);
  const hostDir = sockVol?.hostPath?.path;
  if (!hostDir || sockVol.hostPath.type !== "DirectoryOrCreate")
    fail(where, `the socket directory ${socketDir} must be a hostPath volume of type DirectoryOrCreate`);

  // Probes: `proxyep status --socket <the socket>`.
  for (const probe of ["readinessProbe", "livenessProbe"])
    if (!isStatusProbe(container[probe], socket))
      fail(where, `${probe} must exec \`proxyep status --socket ${socket}\``);
  if (container.startupProbe && !isStatusProbe(container.startupProbe, socket))
    fail(where, `startupProbe must exec \`proxyep status --socket ${socket}\``);

  // Pinning memory, EFA devices, hugepages.
  if (!(container.securityContext?.capabilities?.add ?? []).includes("IPC_LOCK"))
    fail(where, "securityContext.capabilities.add must include IPC_LOCK (memory registration pins pages)");
  const ib = mountFor(spec, container, "/dev/infiniband").volume;
  if (ib?.hostPath?.path !== "/dev/infiniband") fail(where, "/dev/infiniband must be mounted from the host");
  const req = container.resources?.requests ?? {}, lim = container.resources?.limits ?? {};
  if (!req["hugepages-2Mi"] || String(req["hugepages-2Mi"]) !== String(lim["hugepages-2Mi"]))
    fail(where, "hugepages-2Mi must be requested and limited, with requests = limits");

  // Draining: grace above the drain deadline.
  const drainMs = Number(config["daemon.drain_timeout_ms"] ?? DEFAULT_DRAIN_MS);
  const grace = spec.terminationGracePeriodSeconds ?? 30;
  if (!(grace >= Math.ceil(drainMs / 1000) + GRACE_MARGIN_S))
    fail(where, `terminationGracePeriodSeconds ${grace} must be >= daemon.drain_timeout_ms/1000 + ${GRACE_MARGIN_S} = ${Math.ceil(drainMs / 1000) + GRACE_MARGIN_S}`);

  // Scheduling and updates (DEPLOY.md).
  const pcs = spec.priorityClassName;
  if (pcs !== "system-node-critical" && !objects.some((o) => o.obj.kind === "PriorityClass" && o.obj.metadata?.name === pcs))
    fail(where, `priorityClassName must be system-node-critical or a PriorityClass defined here, not ${pcs}`);
  const us = ds.spec?.updateStrategy;
  if (!(us?.type === "OnDelete" || (us?.type === "RollingUpdate" && String(us.rollingUpdate?.maxUnavailable) === "1")))
    fail(where, "updateStrategy must be OnDelete or RollingUpdate with maxUnavailable 1 (never restart every proxy at once)");

  // Metrics: the annotated port is the daemon's metrics port, reachable from outside the pod.
  const ann = ds.spec?.template?.metadata?.annotations ?? {};
  const metricsPort = argAfter(cmd, "--metrics-port") ?? (config["metrics.port"] !== undefined ? String(config["metrics.port"]) : undefined);
  if (ann["prometheus.io/scrape"] !== "true" || !metricsPort || ann["prometheus.io/port"] !== metricsPort)
    fail(where, `prometheus.io/scrape must be "true" and prometheus.io/port the daemon's --metrics-port (${metricsPort})`);
  if (metricsPort && !(container.ports ?? []).some((p) => String(p.containerPort) === metricsPort))
    fail(where, `the metrics port ${metricsPort} must be a containerPort`);
  const setAddr = cmd.find((a) => a.startsWith("metrics.address="))?.slice("metrics.address=".length);
  const addr = setAddr ?? config["metrics.address"] ?? "127.0.0.1";
  if (addr === "127.0.0.1" || addr === "localhost")
    fail(where, "metrics.address is loopback: Prometheus cannot scrape it (set 0.0.0.0)");

  // EFA ownership: nobody here requests vpc.amazonaws.com/efa (the daemon owns the devices).
  for (const o of objects) {
    const ps = podSpecOf(o.obj);
    for (const c of [...(ps?.containers ?? []), ...(ps?.initContainers ?? [])]) {
      const r = { ...(c.resources?.requests ?? {}), ...(c.resources?.limits ?? {}) };
      if ("vpc.amazonaws.com/efa" in r)
        fail(o.where, `container ${c.name} requests vpc.amazonaws.com/efa; the daemon owns every EFA device (deploy/README.md)`);
    }
  }

  // Workers: every other pod that names the daemon's socket mounts the same host directory at
  // the same place, and names the same socket.
  let workers = 0;
  for (const o of objects) {
    if (o.obj === ds) continue;
    const ps = podSpecOf(o.obj);
    for (const c of [...(ps?.containers ?? []), ...(ps?.initContainers ?? [])]) {
      const env = (c.env ?? []).find((e) => e.name === "PROXYEP_DAEMON_SOCKET");
      if (!env) continue;
      workers++;
      if (env.value !== socket) fail(o.where, `container ${c.name}: PROXYEP_DAEMON_SOCKET=${env.value}, but the daemon serves ${socket}`);
      const { volume } = mountFor(ps, c, socketDir);
      if (!volume?.hostPath || volume.hostPath.path !== hostDir)
        fail(o.where, `container ${c.name} must mount the host directory ${hostDir} at ${socketDir} (as the DaemonSet does)`);
    }
  }
  if (workers === 0) fail("examples", "no worker example sets PROXYEP_DAEMON_SOCKET");
}

let knownCache;
function knownParameters() {
  if (knownCache !== undefined) return knownCache;
  const file = path.join(repo, "common/params.cpp");
  knownCache = fs.existsSync(file)
    ? new Set([...fs.readFileSync(file, "utf8").matchAll(/Param<[^>]+>\s+\w+\{\s*"([a-z0-9_.]+)"/g)].map((m) => m[1]))
    : null;
  return knownCache;
}

// ---------------------------------------------------------------- main
const report = (errors) => errors.forEach((e) => console.log(`  ${e}`));
const args = process.argv.slice(2);
if (args.length > 1 || args[0]?.startsWith("-")) {
  console.error("usage: validate_k8s.mjs [DIR]");
  process.exit(2);
}
try {
  resolveFile("kubernetes-models/apps/v1/DaemonSet");
} catch {
  console.error("validate_k8s: kubernetes-models is not installed (npm ci --prefix tests/deploy)");
  process.exit(2);
}
let status = 0;
const realDir = args[0] ? path.resolve(args[0]) : path.join(repo, "deploy/kubernetes");
const real = readTree(realDir);
const realErrors = await validateTree(real, path.relative(repo, realDir) || ".");
if (realErrors.length) {
  console.log(`FAIL: ${path.relative(repo, realDir)}`);
  report(realErrors);
  status = 1;
} else {
  console.log(`ok: ${path.relative(repo, realDir)} (${real.size} files)`);
}

if (!args[0]) {
  const brokenRoot = path.join(here, "broken/k8s");
  const cases = fs.readdirSync(brokenRoot, { withFileTypes: true }).filter((d) => d.isDirectory()).map((d) => d.name).sort();
  for (const name of cases) {
    const dir = path.join(brokenRoot, name);
    const expect = fs.readFileSync(path.join(dir, "EXPECT"), "utf8").trim();
    const files = new Map(real);
    for (const [rel, text] of readTree(dir)) files.set(rel, text);
    const errors = await validateTree(files, `broken/k8s/${name}`);
    const hit = errors.find((e) => e.includes(expect));
    if (!errors.length) {
      console.log(`FAIL: broken/k8s/${name} passed, but must fail (${expect})`);
      status = 1;
    } else if (!hit) {
      console.log(`FAIL: broken/k8s/${name} failed, but not with '${expect}':`);
      report(errors);
      status = 1;
    } else {
      console.log(`ok: broken/k8s/${name} fails as it must: ${hit}`);
    }
  }
  if (cases.length < 5) {
    console.log(`FAIL: expected at least 5 broken cases under tests/deploy/broken/k8s, found ${cases.length}`);
    status = 1;
  }
}
process.exit(status);
