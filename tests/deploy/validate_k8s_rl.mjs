// The project rules of deploy/kubernetes/rl (MoE RL across machines), called by validate_k8s.mjs
// on the objects it parsed and schema-checked. They tie the manifests to the run config and to
// the roles' command lines, which the schemas cannot see:
//   - the run config (ConfigMap proxyep-rl-run, key run.json) is JSON the roles accept in shape;
//   - the trainer Job: Indexed, completions == parallelism == trainer.ranks; MASTER_ADDR is the
//     index-0 pod's stable name through a headless Service the Job's subdomain names;
//   - the rollout Deployment: replicas == rollout.workers; `proxyep launch -n` == rollout.ranks;
//     rollout.drain_budget_s + margin <= the launcher's --grace-ms <= terminationGracePeriodSeconds
//     - margin, and the grace period fits the 2-minute Spot notice; only Spot nodes (EKS managed
//     and Karpenter labels), with tolerations that agree with the selectors;
//   - the Redis StatefulSet: its --dir is a volumeClaimTemplate's mount;
//   - every workload runs `proxyep rl <its role>` with flags the role's parser knows
//     (python/proxyep/rl/roles/flags.json, kept equal to the parsers by a Python test);
//   - every container requests cpu and memory; GPU requests equal limits;
//   - a pod that writes checkpoints to S3 runs as a ServiceAccount with an IRSA role.
import fs from "node:fs";
import path from "node:path";

const RL_DIR = "rl";
// Seconds between one deadline and the next (process exit, signal delivery).
const MARGIN_S = 5;
const SPOT_NOTICE_S = 120;
const SPOT_LABELS = { "eks.amazonaws.com/capacityType": "SPOT", "karpenter.sh/capacity-type": "spot" };
const ROLE_OF_KIND = { Job: "trainer", Deployment: "worker", StatefulSet: "coordinator" };

const argAfter = (cmd, flag) => {
  const i = cmd.indexOf(flag);
  return i >= 0 && i + 1 < cmd.length ? String(cmd[i + 1]) : undefined;
};

function loadFlags(repo, fail) {
  const file = path.join(repo, "python/proxyep/rl/roles/flags.json");
  try {
    return JSON.parse(fs.readFileSync(file, "utf8"));
  } catch (e) {
    fail("python/proxyep/rl/roles/flags.json", `cannot read the roles' flags: ${e.message}`);
    return null;
  }
}

// The role a container runs and the flags after `rl <role>`: null when it runs no role.
function roleCommand(container) {
  const cmd = [...(container.command ?? []), ...(container.args ?? [])].map(String);
  for (let i = 0; i + 2 < cmd.length + 1; i++) {
    if (path.basename(cmd[i]) === "proxyep" && cmd[i + 1] === "rl" && cmd[i + 2] !== undefined)
      return { role: cmd[i + 2], args: cmd.slice(i + 3), before: cmd.slice(0, i), cmd };
  }
  return null;
}

function runConfig(objects, fail) {
  const cm = objects.find((o) => o.obj.kind === "ConfigMap" && o.obj.metadata?.name === "proxyep-rl-run");
  if (!cm) {
    fail("rl", "no ConfigMap proxyep-rl-run holding run.json (the run config every role reads)");
    return null;
  }
  try {
    const config = JSON.parse(cm.obj.data?.["run.json"] ?? "");
    if (!config || typeof config !== "object" || Array.isArray(config)) throw new Error("not a JSON object");
    return { cm, config };
  } catch (e) {
    fail(cm.where, `run.json: invalid JSON: ${e.message}`);
    return null;
  }
}

// The config's value, or the RunConfig default (python/proxyep/rl/run_config.py).
const DEFAULTS = { "trainer.ranks": 2, "rollout.workers": 2, "rollout.ranks": 2, "rollout.drain_budget_s": 30.0 };
const setting = (config, name) => {
  const [section, key] = name.split(".");
  return config?.[section]?.[key] ?? DEFAULTS[name];
};

function checkContainers(o, spec, fail) {
  for (const c of [...(spec.containers ?? []), ...(spec.initContainers ?? [])]) {
    const req = c.resources?.requests ?? {};
    if (req.cpu === undefined || req.memory === undefined)
      fail(o.where, `container ${c.name} must request cpu and memory (resources.requests)`);
    const gpuReq = req["nvidia.com/gpu"], gpuLim = c.resources?.limits?.["nvidia.com/gpu"];
    if ((gpuReq !== undefined || gpuLim !== undefined) && String(gpuReq) !== String(gpuLim))
      fail(o.where, `container ${c.name}: nvidia.com/gpu requests (${gpuReq}) must equal limits (${gpuLim})`);
  }
}

function checkRoleFlags(o, rc, flags, fail) {
  const known = flags?.[rc.role];
  if (!known) return fail(o.where, `\`proxyep rl ${rc.role}\` is not a role (coordinator, trainer, worker)`);
  for (const arg of rc.args)
    if (arg.startsWith("--") && !known.includes(arg.split("=")[0]))
      fail(o.where, `\`proxyep rl ${rc.role}\` has no flag ${arg} (python/proxyep/rl/roles/flags.json)`);
}

function checkSpot(o, spec, fail) {
  const terms = spec.affinity?.nodeAffinity?.requiredDuringSchedulingIgnoredDuringExecution?.nodeSelectorTerms ?? [];
  const selected = new Map(); // label -> value every term of that label requires
  for (const term of terms)
    for (const e of term.matchExpressions ?? [])
      if (e.key in SPOT_LABELS && e.operator === "In") selected.set(e.key, e.values ?? []);
  for (const [key, value] of Object.entries(SPOT_LABELS)) {
    const values = selected.get(key);
    if (!values || values.length !== 1 || values[0] !== value)
      fail(o.where, `the rollout pool must select Spot nodes with ${key} In [${value}] (one nodeSelectorTerm each)`);
  }
  // Every term must pin a Spot label, or the pool could land on on-demand nodes.
  for (const [i, term] of terms.entries())
    if (!(term.matchExpressions ?? []).some((e) => e.key in SPOT_LABELS && e.operator === "In"))
      fail(o.where, `nodeSelectorTerms[${i}] selects no Spot label: the pool would run on on-demand nodes`);
  const tolerations = spec.tolerations ?? [];
  for (const [key, value] of Object.entries(SPOT_LABELS)) {
    const ok = tolerations.some((t) => t.key === key &&
      (t.operator === "Exists" || ((t.operator ?? "Equal") === "Equal" && t.value === value)));
    if (!ok) fail(o.where, `Spot selectors and tolerations disagree: no toleration for ${key}=${value}`);
  }
  for (const t of tolerations)
    if (t.key in SPOT_LABELS && t.operator !== "Exists" && t.value !== SPOT_LABELS[t.key])
      fail(o.where, `Spot selectors and tolerations disagree: toleration ${t.key}=${t.value}, selector ${SPOT_LABELS[t.key]}`);
}

function checkTrainer(o, spec, rc, config, objects, fail) {
  const job = o.obj.spec ?? {};
  const ranks = setting(config, "trainer.ranks");
  if (job.completionMode !== "Indexed") fail(o.where, "the trainer Job must be completionMode: Indexed (RANK = index)");
  if (job.completions !== ranks || job.parallelism !== ranks)
    fail(o.where, `completions (${job.completions}) and parallelism (${job.parallelism}) must equal trainer.ranks (${ranks})`);
  const env = Object.fromEntries((spec.containers ?? []).flatMap((c) => c.env ?? []).map((e) => [e.name, e]));
  const service = objects.find((s) => s.obj.kind === "Service" && s.obj.metadata?.name === spec.subdomain &&
    s.obj.metadata?.namespace === o.obj.metadata?.namespace);
  if (!service || service.obj.spec?.clusterIP !== "None")
    fail(o.where, `spec.template.spec.subdomain must name a headless Service here (found ${spec.subdomain})`);
  else {
    const labels = o.obj.spec?.template?.metadata?.labels ?? {};
    const sel = service.obj.spec?.selector ?? {};
    if (!Object.keys(sel).length || !Object.entries(sel).every(([k, v]) => labels[k] === v))
      fail(service.where, "the trainer's headless Service must select the trainer's pods");
  }
  const master = `${o.obj.metadata?.name}-0.${spec.subdomain}`;
  const addr = env.MASTER_ADDR?.value ?? "";
  if (addr !== master && !addr.startsWith(`${master}.`))
    fail(o.where, `MASTER_ADDR must be the index-0 pod's stable name ${master}, not ${addr || "unset"}`);
  if (!env.MASTER_PORT) fail(o.where, "MASTER_PORT must be set");
  const publish = argAfter(rc.args, "--publish");
  if (publish && !publish.startsWith(`${master}:`) && !publish.startsWith(`${master}.`))
    fail(o.where, `--publish ${publish} must advertise rank 0's stable name ${master}`);
  const checkpoints = argAfter(rc.args, "--checkpoints") ?? "";
  const viaEnv = checkpoints.match(/^\$\((\w+)\)$/);
  const ref = viaEnv && env[viaEnv[1]]?.valueFrom?.configMapKeyRef;
  const cmValue = ref && objects.find((c) => c.obj.kind === "ConfigMap" && c.obj.metadata?.name === ref.name)?.obj.data?.[ref.key];
  const resolved = cmValue ?? checkpoints;
  if (resolved.startsWith("s3://")) {
    const sa = objects.find((s) => s.obj.kind === "ServiceAccount" && s.obj.metadata?.name === spec.serviceAccountName);
    if (!sa?.obj.metadata?.annotations?.["eks.amazonaws.com/role-arn"])
      fail(o.where, `checkpoints in S3 need a ServiceAccount with the IRSA annotation eks.amazonaws.com/role-arn (serviceAccountName ${spec.serviceAccountName})`);
  }
}

function checkWorker(o, spec, rc, config, fail) {
  const workers = setting(config, "rollout.workers"), ranks = setting(config, "rollout.ranks");
  if (o.obj.spec?.replicas !== workers)
    fail(o.where, `replicas (${o.obj.spec?.replicas}) must equal rollout.workers (${workers})`);
  const launch = rc.before;
  const isLaunch = launch.length >= 2 && path.basename(launch[0]) === "proxyep" && launch[1] === "launch";
  if (!isLaunch) return fail(o.where, "the worker must run under `proxyep launch -n <rollout.ranks> --grace-ms ... --`");
  const n = Number(argAfter(launch, "-n") ?? argAfter(launch, "--ranks"));
  if (n !== ranks) fail(o.where, `proxyep launch -n ${n} must equal rollout.ranks (${ranks})`);
  const drain = setting(config, "rollout.drain_budget_s");
  const graceMs = Number(argAfter(launch, "--grace-ms") ?? 3000);
  const podGrace = spec.terminationGracePeriodSeconds ?? 30;
  if (!(graceMs / 1000 >= drain + MARGIN_S))
    fail(o.where, `the launcher's --grace-ms ${graceMs} must be >= (rollout.drain_budget_s ${drain} + ${MARGIN_S}) * 1000`);
  if (!(podGrace >= graceMs / 1000 + MARGIN_S))
    fail(o.where, `terminationGracePeriodSeconds ${podGrace} must be >= the launcher's grace ${graceMs / 1000} s + ${MARGIN_S} (rollout.drain_budget_s ${drain})`);
  if (podGrace > SPOT_NOTICE_S)
    fail(o.where, `terminationGracePeriodSeconds ${podGrace} exceeds the ${SPOT_NOTICE_S} s Spot notice`);
  checkSpot(o, spec, fail);
}

function checkCoordinator(o, spec, rc, fail) {
  const dir = argAfter(rc.args, "--dir");
  const container = (spec.containers ?? []).find((c) => roleCommand(c)?.role === "coordinator");
  const mount = (container?.volumeMounts ?? []).find((m) => path.normalize(m.mountPath) === path.normalize(dir ?? ""));
  const claims = (o.obj.spec?.volumeClaimTemplates ?? []).map((t) => t.metadata?.name);
  if (!mount || !claims.includes(mount.name))
    fail(o.where, `the coordinator's --dir ${dir} must be a volumeClaimTemplate's mount (the append-only file must survive the pod)`);
}

export function rlRules(objects, repo, fail) {
  const rl = objects.filter((o) => o.file.split(path.sep)[0] === RL_DIR);
  if (!rl.length) return;
  const flags = loadFlags(repo, fail);
  const loaded = runConfig(rl, fail);
  const config = loaded?.config;
  const seen = new Set();
  for (const o of rl) {
    const role = ROLE_OF_KIND[o.obj.kind];
    if (!role) continue;
    const spec = o.obj.spec?.template?.spec ?? {};
    checkContainers(o, spec, fail);
    const commands = (spec.containers ?? []).map(roleCommand).filter(Boolean);
    for (const rc of commands) checkRoleFlags(o, rc, flags, fail);
    const rc = commands.find((c) => c.role === role);
    if (!rc) {
      fail(o.where, `a ${o.obj.kind} here must run \`proxyep rl ${role}\` (runs: ${commands.map((c) => c.role).join(", ") || "no role"})`);
      continue;
    }
    seen.add(role);
    if (role === "trainer") checkTrainer(o, spec, rc, config, rl, fail);
    if (role === "worker") checkWorker(o, spec, rc, config, fail);
    if (role === "coordinator") checkCoordinator(o, spec, rc, fail);
  }
  for (const role of ["trainer", "worker"])
    if (!seen.has(role)) fail(RL_DIR, `no workload runs \`proxyep rl ${role}\``);
}
