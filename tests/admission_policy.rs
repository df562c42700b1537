//! packaging/k8s/admission-policy.yaml (issue 21, `allocation.trust-annotations = "admission"`),
//! evaluated by a real CEL interpreter (the `cel` crate, standard library and macros only) over
//! AdmissionReview-shaped requests, the way the API server evaluates a ValidatingAdmissionPolicy:
//! `object`, `oldObject` (null on CREATE), `request` (userInfo.username, namespace, operation…),
//! `params` (null: the policy has no paramKind), `variables` in their order; every matchCondition
//! must hold for the policy to apply, then every validation must hold, and an expression that
//! fails to evaluate refuses the request (failurePolicy: Fail).
//!
//! And the policy covers every annotation key a dialect reads: the key constants of
//! src/allocation (found by reading its sources, so a new one fails here until it is covered or
//! named below as not a pod annotation) and every pattern of the pod annotation allow-list
//! `gpufence runtime configure` writes into containerd.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use cel::{Context, Env, Program, Value};
use gpufence::allocation::container_dialects;
use gpufence::allocation::pod_dialects::{
    gpushare_pod as gpushare, hami_mig, hami_pod as hami, kai_pod as kai,
};
use proptest::prelude::*;
use serde::Deserialize;
use serde_json::{Value as Json, json};

const POLICY: &str = "packaging/k8s/admission-policy.yaml";
const USER: &str = "alice@example.com";
const TENANT: &str = "team-a";

/// The two documents of the policy file.
fn documents() -> (Json, Json) {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(POLICY))
        .expect("read the policy");
    let docs: Vec<Json> = yaml_serde::Deserializer::from_str(&text)
        .map(|d| Json::deserialize(d).expect("a YAML document"))
        .collect();
    assert_eq!(docs.len(), 2, "a policy and its binding");
    (docs[0].clone(), docs[1].clone())
}

fn expr(v: &Json, what: &str) -> String {
    v.as_str()
        .unwrap_or_else(|| panic!("{what}: not a string"))
        .to_string()
}

/// One compiled expression and where it came from.
struct Expr {
    name: String,
    source: String,
    program: Program,
}

struct Validation {
    check: Expr,
    message: String,
    message_expression: Option<Expr>,
}

/// The policy, compiled.
struct Policy {
    env: Arc<Env>,
    match_conditions: Vec<Expr>,
    variables: Vec<Expr>,
    validations: Vec<Validation>,
}

fn compile(env: &Env, name: &str, source: &str) -> Expr {
    let program = env
        .compile(source)
        .unwrap_or_else(|e| panic!("{name}: {source}: {e}"));
    Expr {
        name: name.to_string(),
        source: source.to_string(),
        program,
    }
}

fn policy() -> Policy {
    let (vap, _) = documents();
    let env = Env::stdlib();
    let spec = &vap["spec"];
    let list = |k: &str| spec[k].as_array().cloned().unwrap_or_default();
    // matchConditions and variables: `{name, expression}` each.
    let named = |k: &str| -> Vec<Expr> {
        list(k)
            .iter()
            .map(|m| compile(&env, &expr(&m["name"], k), &expr(&m["expression"], k)))
            .collect()
    };
    let match_conditions = named("matchConditions");
    let variables = named("variables");
    let validations = list("validations")
        .iter()
        .enumerate()
        .map(|(i, v)| Validation {
            check: compile(
                &env,
                &format!("validation {i}"),
                &expr(&v["expression"], "v"),
            ),
            message: expr(&v["message"], "message"),
            message_expression: v
                .get("messageExpression")
                .map(|m| compile(&env, &format!("messageExpression {i}"), &expr(m, "me"))),
        })
        .collect();
    Policy {
        env: Arc::new(env),
        match_conditions,
        variables,
        validations,
    }
}

/// The API server's answer.
#[derive(Debug, Clone, PartialEq)]
enum Verdict {
    /// A matchCondition is false: the policy does not apply.
    NotMatched,
    Allowed,
    /// A validation is false (its message), or an expression failed (failurePolicy: Fail).
    Denied(String),
}

impl Verdict {
    fn denied(&self) -> bool {
        matches!(self, Verdict::Denied(_))
    }
}

/// An AdmissionReview's request, as the policy sees it.
#[derive(Clone)]
struct Review {
    operation: &'static str,
    username: String,
    namespace: String,
    sub_resource: &'static str,
    object: Json,
    old_object: Json,
}

fn pod(annotations: &[(&str, &str)]) -> Json {
    let mut meta = json!({"name": "p", "namespace": TENANT, "labels": {"app": "p"}});
    if !annotations.is_empty() {
        let a: BTreeMap<&str, &str> = annotations.iter().copied().collect();
        meta["annotations"] = json!(a);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": "main", "image": "cuda"}]}
    })
}

fn create(username: &str, object: Json) -> Review {
    Review {
        operation: "CREATE",
        username: username.to_string(),
        namespace: TENANT.to_string(),
        sub_resource: "",
        object,
        old_object: Json::Null,
    }
}

fn update(username: &str, old: Json, new: Json) -> Review {
    Review {
        operation: "UPDATE",
        old_object: old,
        ..create(username, new)
    }
}

fn in_namespace(mut r: Review, ns: &str) -> Review {
    r.namespace = ns.to_string();
    for o in [&mut r.object, &mut r.old_object] {
        if o.is_object() {
            o["metadata"]["namespace"] = json!(ns);
        }
    }
    r
}

fn request(r: &Review) -> Json {
    let kind = if r.sub_resource == "binding" {
        "Binding"
    } else {
        "Pod"
    };
    json!({
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "", "version": "v1", "kind": kind},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "subResource": r.sub_resource,
        "requestKind": {"group": "", "version": "v1", "kind": kind},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "name": "p",
        "namespace": r.namespace,
        "operation": r.operation,
        "userInfo": {
            "username": r.username,
            "uid": "014fbff9a07c",
            "groups": ["system:authenticated"]
        },
        "dryRun": false
    })
}

fn cel(v: &Json) -> Value {
    cel::to_value(v).expect("JSON to CEL")
}

fn as_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.to_string()),
        _ => None,
    }
}

impl Policy {
    /// Evaluate as the API server does.
    fn admit(&self, r: &Review) -> Verdict {
        let mut ctx = Context::with_env(self.env.clone());
        ctx.add_variable_from_value("object", cel(&r.object));
        ctx.add_variable_from_value("oldObject", cel(&r.old_object));
        ctx.add_variable_from_value("request", cel(&request(r)));
        ctx.add_variable_from_value("params", Value::Null);
        ctx.add_variable_from_value(
            "namespaceObject",
            cel(&json!({"metadata": {"name": r.namespace}})),
        );
        let mut vars: HashMap<String, Value> = HashMap::new();
        ctx.add_variable_from_value("variables", vars.clone());
        for m in &self.match_conditions {
            match m.program.execute(&ctx) {
                Ok(Value::Bool(true)) => {}
                Ok(Value::Bool(false)) => return Verdict::NotMatched,
                other => return Verdict::Denied(format!("matchCondition {}: {other:?}", m.name)),
            }
        }
        for v in &self.variables {
            match v.program.execute(&ctx) {
                Ok(val) => {
                    vars.insert(v.name.clone(), val);
                    ctx.add_variable_from_value("variables", vars.clone());
                }
                Err(e) => return Verdict::Denied(format!("variable {}: {e}", v.name)),
            }
        }
        for v in &self.validations {
            match v.check.program.execute(&ctx) {
                Ok(Value::Bool(true)) => {}
                Ok(Value::Bool(false)) => {
                    let msg = v
                        .message_expression
                        .as_ref()
                        .and_then(|m| m.program.execute(&ctx).ok())
                        .and_then(|m| as_string(&m))
                        .unwrap_or_else(|| v.message.clone());
                    return Verdict::Denied(msg);
                }
                other => return Verdict::Denied(format!("{}: {other:?}", v.check.name)),
            }
        }
        Verdict::Allowed
    }

    /// A variable's value for a request (the policy's own lists).
    fn variable(&self, name: &str) -> Vec<String> {
        let r = create(USER, pod(&[]));
        let mut ctx = Context::with_env(self.env.clone());
        ctx.add_variable_from_value("object", cel(&r.object));
        ctx.add_variable_from_value("oldObject", Value::Null);
        ctx.add_variable_from_value("request", cel(&request(&r)));
        ctx.add_variable_from_value("variables", HashMap::<String, Value>::new());
        let v = self
            .variables
            .iter()
            .find(|v| v.name == name)
            .unwrap_or_else(|| panic!("no variable {name}"));
        match v.program.execute(&ctx) {
            Ok(Value::List(l)) => l.iter().map(|s| as_string(s).unwrap()).collect(),
            Ok(Value::String(s)) => vec![s.to_string()],
            other => panic!("{name}: {other:?}"),
        }
    }
}

fn scheduler_accounts(p: &Policy) -> Vec<String> {
    let a = p.variable("allowedServiceAccounts");
    assert!(!a.is_empty());
    a
}

/// One key of every dialect's keys and key prefixes, from gpufence's own constants.
fn dialect_keys() -> Vec<String> {
    let mut keys: Vec<String> = container_dialects::KNOWN_ANNOTATIONS
        .iter()
        .map(|s| s.to_string())
        .collect();
    keys.push(format!("{}future", container_dialects::ANN_PREFIX));
    keys.push(format!(
        "{}nvidia-device-plugin_1",
        gpufence::cdi::parse::ANNOTATION_PREFIX
    ));
    keys.push(hami::ALLOCATED.to_string());
    keys.push(hami::VOLCANO_ALLOCATED.to_string());
    keys.push(hami_mig::MIG_ALLOCATIONS.to_string());
    keys.push(gpufence::allocation::koordinator::ALLOCATED.to_string());
    keys.push(container_dialects::ALIYUN_GPU_COUNT.to_string());
    for k in [
        gpushare::IDX,
        gpushare::POD,
        gpushare::DEV,
        gpushare::ASSIGNED,
        gpushare::ASSUME_TIME,
    ] {
        keys.push(k.to_string());
    }
    keys.push(format!("{}OTHER", container_dialects::ALIYUN_PREFIX));
    for s in [
        kai::DEVICES,
        kai::MEMORY_LIMIT,
        kai::MEMORY_REQUEST,
        kai::COMPUTE_MODE,
    ] {
        keys.push(format!("{}main.{s}", kai::PREFIX));
    }
    keys
}

#[test]
fn the_policy_is_a_v1_fail_closed_policy_on_pod_create_and_update_with_a_deny_binding() {
    let (vap, binding) = documents();
    assert_eq!(vap["apiVersion"], "admissionregistration.k8s.io/v1");
    assert_eq!(vap["kind"], "ValidatingAdmissionPolicy");
    assert_eq!(vap["spec"]["failurePolicy"], "Fail");
    assert!(vap["spec"].get("paramKind").is_none());
    // docs/allocations-and-trust.md ("Apply it") tells operators to patch
    // /spec/variables/0/expression.
    assert_eq!(
        vap["spec"]["variables"][0]["name"],
        "allowedServiceAccounts"
    );
    let rules = vap["spec"]["matchConstraints"]["resourceRules"]
        .as_array()
        .unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0]["apiGroups"], json!([""]));
    assert_eq!(rules[0]["operations"], json!(["CREATE", "UPDATE"]));
    let resources = rules[0]["resources"].as_array().unwrap();
    for r in ["pods", "pods/binding", "pods/status"] {
        assert!(resources.contains(&json!(r)), "{r}");
    }
    assert_eq!(binding["apiVersion"], "admissionregistration.k8s.io/v1");
    assert_eq!(binding["kind"], "ValidatingAdmissionPolicyBinding");
    assert_eq!(binding["spec"]["policyName"], vap["metadata"]["name"]);
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    assert!(binding["spec"].get("matchResources").is_none());
}

#[test]
fn every_expression_uses_only_standard_cel() {
    // The interpreter would accept its extensions; the API server's type checker and CEL
    // libraries differ there, so only the standard operators, macros and these functions.
    let standard = ["size", "startsWith", "endsWith", "contains"];
    let p = policy();
    let all = p
        .match_conditions
        .iter()
        .chain(&p.variables)
        .chain(p.validations.iter().map(|v| &v.check))
        .chain(
            p.validations
                .iter()
                .filter_map(|v| v.message_expression.as_ref()),
        );
    for e in all {
        for f in e.program.references().functions() {
            let operator = f.starts_with('_') || f.ends_with('_') || f.starts_with('@');
            assert!(
                operator || standard.contains(&f),
                "{}: {f} is not standard CEL: {}",
                e.name,
                e.source
            );
        }
        for ext in [".?", "orValue", "optional.", "split(", "join(", "matches("] {
            assert!(!e.source.contains(ext), "{}: {ext}", e.name);
        }
    }
}

#[test]
fn a_users_create_with_any_dialects_key_is_denied_naming_the_key_and_the_user() {
    let p = policy();
    for key in dialect_keys() {
        let v = p.admit(&create(USER, pod(&[(&key, "0"), ("team", "a")])));
        let Verdict::Denied(msg) = &v else {
            panic!("{key}: {v:?}");
        };
        assert!(msg.contains(&key) && msg.contains(USER), "{key}: {msg}");
        assert!(!msg.contains('\n'), "one line: {msg}");
    }
}

#[test]
fn the_scheduler_accounts_may_create_and_update_every_dialects_keys() {
    let p = policy();
    for sa in scheduler_accounts(&p) {
        assert!(sa.starts_with("system:serviceaccount:"), "{sa}");
        for key in dialect_keys() {
            let with = pod(&[(&key, "1")]);
            assert_eq!(
                p.admit(&create(&sa, with.clone())),
                Verdict::Allowed,
                "{sa} {key}"
            );
            let before = pod(&[("team", "a")]);
            let set = update(&sa, before.clone(), with.clone());
            assert_eq!(p.admit(&set), Verdict::Allowed, "{sa} sets {key}");
            let changed = update(&sa, with.clone(), pod(&[(&key, "2")]));
            assert_eq!(p.admit(&changed), Verdict::Allowed, "{sa} changes {key}");
            let removed = update(&sa, with, before);
            assert_eq!(p.admit(&removed), Verdict::Allowed, "{sa} removes {key}");
        }
    }
}

#[test]
fn a_users_update_that_sets_changes_or_removes_a_key_is_denied() {
    let p = policy();
    for key in dialect_keys() {
        let plain = pod(&[("team", "a")]);
        let with = pod(&[(&key, "1"), ("team", "a")]);
        let cases = [
            ("sets", update(USER, plain.clone(), with.clone())),
            (
                "changes",
                update(USER, with.clone(), pod(&[(&key, "all"), ("team", "a")])),
            ),
            ("removes", update(USER, with.clone(), plain.clone())),
            (
                "removes every annotation",
                update(USER, with.clone(), pod(&[])),
            ),
            (
                "empties",
                update(USER, with, pod(&[(&key, ""), ("team", "a")])),
            ),
        ];
        for (what, r) in cases {
            assert!(p.admit(&r).denied(), "a user {what} {key}");
        }
    }
}

#[test]
fn a_users_update_leaving_the_keys_untouched_is_allowed() {
    let p = policy();
    let keys = dialect_keys();
    let reserved: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), "1")).collect();
    let mut old = reserved.clone();
    old.push(("team", "a"));
    let mut new = reserved.clone();
    new.push(("team", "b"));
    new.push(("note", "added"));
    let r = update(USER, pod(&old), pod(&new));
    assert_eq!(p.admit(&r), Verdict::Allowed);
    // kubelet's status update and a controller's label change carry the keys unchanged.
    let mut status = update("system:node:gpu-1", pod(&reserved), pod(&reserved));
    status.sub_resource = "status";
    assert_eq!(p.admit(&status), Verdict::Allowed);
    let mut relabelled = pod(&reserved);
    relabelled["metadata"]["labels"]["app"] = json!("q");
    let gc = "system:serviceaccount:kube-system:generic-garbage-collector";
    assert_eq!(
        p.admit(&update(gc, pod(&reserved), relabelled)),
        Verdict::Allowed
    );
}

#[test]
fn pods_without_the_keys_are_allowed_and_pods_without_annotations_not_even_matched() {
    let p = policy();
    let plain = [
        ("team", "a"),
        ("nvidia.com/gpu", "1"),
        ("gpufence.dev", "x"),
        ("gpufence.devices/x", "1"),
        ("example.com/cdi.k8s.io", "1"),
        ("hami.io/vgpu-devices-to-allocate", "x"),
        ("aliyun.com/gpu-mem", "2"),
        ("ALIYUN_COM_GPU_MEMX", "1"),
        ("nvidia.com/containers", "1"),
        ("required-plugins.noderesource.dev", "[gpufence]"),
        ("tolerate-missing-plugins.noderesource.devx", "true"),
    ];
    assert_eq!(p.admit(&create(USER, pod(&plain))), Verdict::Allowed);
    assert_eq!(
        p.admit(&update(USER, pod(&plain), pod(&plain[1..]))),
        Verdict::Allowed
    );
    assert_eq!(p.admit(&create(USER, pod(&[]))), Verdict::NotMatched);
    assert_eq!(
        p.admit(&update(USER, pod(&[]), pod(&[]))),
        Verdict::NotMatched
    );
    // Kubernetes keeps `metadata.annotations: {}` as an empty map.
    let mut empty = pod(&[]);
    empty["metadata"]["annotations"] = json!({});
    assert_eq!(p.admit(&create(USER, empty)), Verdict::Allowed);
}

#[test]
fn a_binding_carrying_a_key_counts_as_setting_it() {
    // pods/binding copies the Binding's annotations onto the pod.
    let p = policy();
    let binding = |ann: &[(&str, &str)]| {
        let mut b = pod(ann);
        b["kind"] = json!("Binding");
        b["target"] = json!({"apiVersion": "v1", "kind": "Node", "name": "gpu-1"});
        b
    };
    let bind = |user: &str, ann: &[(&str, &str)]| {
        let mut r = create(user, binding(ann));
        r.sub_resource = "binding";
        r
    };
    let key = hami::ALLOCATED;
    assert!(
        p.admit(&bind(USER, &[(key, "GPU-1,NVIDIA,1000,10:;")]))
            .denied()
    );
    let default_scheduler = "system:kube-scheduler";
    assert_eq!(p.admit(&bind(default_scheduler, &[])), Verdict::NotMatched);
    assert!(p.admit(&bind(default_scheduler, &[(key, "x")])).denied());
    for sa in scheduler_accounts(&p) {
        assert_eq!(p.admit(&bind(&sa, &[(key, "x")])), Verdict::Allowed, "{sa}");
    }
}

#[test]
fn the_nri_tolerate_annotation_is_reserved_to_gpufences_namespace() {
    let p = policy();
    let key = p.variable("nriTolerateKey").remove(0);
    assert_eq!(key, "tolerate-missing-plugins.noderesource.dev");
    let namespaces = p.variable("nriTolerateNamespaces");
    assert_eq!(
        namespaces,
        ["kube-system"],
        "where packaging/k8s runs gpufence"
    );
    let forms = [
        key.clone(),
        format!("{key}/pod"),
        format!("{key}/container.main"),
    ];
    let sa = scheduler_accounts(&p).remove(0);
    for k in &forms {
        let with = pod(&[(k, "true")]);
        for user in [USER, sa.as_str()] {
            let r = create(user, with.clone());
            let Verdict::Denied(msg) = p.admit(&r) else {
                panic!("{user} {k} in {TENANT}");
            };
            assert!(msg.contains(k.as_str()) && msg.contains(TENANT), "{msg}");
            let set = update(user, pod(&[("team", "a")]), with.clone());
            assert!(p.admit(&set).denied(), "{user} sets {k}");
        }
        let daemonset = "system:serviceaccount:kube-system:daemon-set-controller";
        let own = in_namespace(create(daemonset, with.clone()), "kube-system");
        assert_eq!(p.admit(&own), Verdict::Allowed, "{k} in kube-system");
        // A pod that already carries it (created before the policy) may still be updated.
        let kept = update(USER, with.clone(), with.clone());
        assert_eq!(p.admit(&kept), Verdict::Allowed);
    }
}

#[test]
fn every_key_constant_of_src_allocation_is_covered_or_named_as_no_pod_annotation() {
    // Literal `&str` constants in src/allocation that are not pod annotation keys, and why.
    const NOT_POD_ANNOTATIONS: [(&str, &str); 23] = [
        ("NVIDIA_VISIBLE_DEVICES", "env (allocation.trust-env)"),
        ("NVIDIA_DRIVER_CAPABILITIES", "env"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "HAMi env"),
        ("CUDA_DEVICE_SM_LIMIT", "HAMi env"),
        ("CUDA_OVERSUBSCRIBE", "HAMi env"),
        ("/var/run/nvidia-container-devices", "a mount path"),
        ("no-gpu-has-", "a value marker"),
        ("aliyun.com/gpu-mem", "a resource name"),
        (
            "io.container.manager",
            "podman only (trust-libpod-annotations)",
        ),
        ("io.podman.annotations.", "podman only"),
        (
            "gpus.devices",
            "KAI suffix, after nvidia.com/container.<name>.",
        ),
        ("gpu-memory.limit", "KAI suffix"),
        ("gpu-memory.request", "KAI suffix"),
        ("gpu-compute.mode", "KAI suffix"),
        ("kubelet.checkpoint", "a config key, named in errors"),
        (
            "CUDA_DEVICE_MEMORY_LIMIT_",
            "HAMi env in a DRA driver's CDI spec",
        ),
        ("linux.devices", "a spec field, named in errors"),
        (
            "koordinator.sh/gpu-core",
            "a resource name inside Koordinator's annotation",
        ),
        ("koordinator.sh/gpu-memory", "a resource name"),
        ("koordinator.sh/gpu-memory-ratio", "a resource name"),
        ("gpu", "a device type inside Koordinator's annotation"),
        (
            "koordinator.sh/gpu-isolation-provider",
            "a pod label, read only to word the HAMi-core refusal; it grants nothing",
        ),
        ("HAMi-core", "that label's value"),
    ];
    let p = policy();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/core/src/allocation");
    let mut literals = Vec::new();
    collect_str_consts(&root, &mut literals);
    // The scan finds the dialects (a move of src/allocation must move this test too).
    for anchor in [
        container_dialects::ANN_DEVICES,
        hami::ALLOCATED,
        kai::PREFIX,
        gpushare::IDX,
        gpufence::allocation::koordinator::ALLOCATED,
    ] {
        assert!(
            literals.iter().any(|(_, l)| l == anchor),
            "scan missed {anchor}"
        );
    }
    for (file, lit) in &literals {
        if NOT_POD_ANNOTATIONS.iter().any(|(k, _)| k == lit) {
            continue;
        }
        // A prefix constant is covered when a key under it is.
        let probe = if lit.ends_with('/') || lit.ends_with('.') || lit.ends_with('_') {
            format!("{lit}x")
        } else {
            lit.clone()
        };
        assert!(
            p.admit(&create(USER, pod(&[(&probe, "1")]))).denied(),
            "{file}: {lit:?} is read by a dialect but the admission policy does not reserve it \
             (add it to the policy, or to NOT_POD_ANNOTATIONS with the reason)"
        );
    }
}

/// `(file, literal)` of every `const NAME: &str = "literal";` under `dir`.
fn collect_str_consts(dir: &Path, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            collect_str_consts(&path, out);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            let Some((_, rest)) = line.split_once("const ") else {
                continue;
            };
            let Some((_, value)) = rest.split_once(": &str = \"") else {
                continue;
            };
            if let Some((lit, _)) = value.split_once('"') {
                out.push((path.display().to_string(), lit.to_string()));
            }
        }
    }
}

#[test]
fn the_policy_covers_every_pattern_of_the_pod_annotation_allow_list() {
    // What containerd passes from a pod into config.json (`pod_annotations`, written by
    // `gpufence runtime configure`) is what gpufence can read there: all of it is reserved.
    let p = policy();
    let keys = p.variable("allocationKeys");
    let prefixes = p.variable("allocationKeyPrefixes");
    for pattern in gpufence::allocation::ANNOTATION_ALLOW_LIST {
        let covered = match pattern.strip_suffix('*') {
            Some(stem) => {
                assert!(
                    !stem.contains(['*', '?', '[']),
                    "{pattern}: extend this test"
                );
                prefixes.iter().any(|q| stem.starts_with(q.as_str()))
            }
            None => {
                keys.iter().any(|k| k == pattern)
                    || prefixes.iter().any(|q| pattern.starts_with(q.as_str()))
            }
        };
        assert!(covered, "{pattern} reaches config.json but is not reserved");
    }
}

/// The policy's verdict, modelled: a user is denied exactly when a reserved key differs.
fn reserved(p: &Policy, k: &str) -> bool {
    p.variable("allocationKeys").iter().any(|x| x == k)
        || p.variable("allocationKeyPrefixes")
            .iter()
            .any(|q| k.starts_with(q.as_str()))
}

fn annotation_maps() -> impl Strategy<Value = BTreeMap<String, String>> {
    let keys = prop::sample::select(vec![
        "gpufence.dev/devices",
        "gpufence.dev/memory",
        "cdi.k8s.io/x",
        "hami.io/vgpu-devices-allocated",
        "ALIYUN_COM_GPU_MEM_IDX",
        "aliyun.com/gpu-count",
        "nvidia.com/container.main.gpus.devices",
        "scheduling.koordinator.sh/device-allocated",
        "volcano.sh/vgpu-ids-new",
        "hami.io/vgpu-mig-allocations",
        "team",
        "nvidia.com/gpu",
        "hami.io/vgpu-node",
    ]);
    prop::collection::btree_map(keys.prop_map(str::to_string), "[a-c]{0,2}", 0..5)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn a_user_is_denied_exactly_when_a_reserved_key_differs(
        old in annotation_maps(),
        new in annotation_maps(),
    ) {
        let p = policy();
        let to_pod = |m: &BTreeMap<String, String>| {
            let v: Vec<(&str, &str)> = m.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            pod(&v)
        };
        let differs = old
            .keys()
            .chain(new.keys())
            .any(|k| reserved(&p, k) && old.get(k) != new.get(k));
        let v = p.admit(&update(USER, to_pod(&old), to_pod(&new)));
        prop_assert_eq!(v.denied(), differs, "{:?} -> {:?}: {:?}", old, new, v);
        let sa = scheduler_accounts(&p).remove(0);
        prop_assert!(!p.admit(&update(&sa, to_pod(&old), to_pod(&new))).denied());
    }
}
