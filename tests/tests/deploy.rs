//! What an operator deploys: the Kubernetes manifests in
//! `deploy/kubernetes/` render with `kubectl kustomize` (Debian's kubectl),
//! validate against the Kubernetes API schemas (`kubernetes-validate`, from
//! PyPI, strict), wire what sluice needs (pod name as the static member
//! id, secrets from the Secret, probes on `/healthz` and `/readyz`, a grace
//! period past the shutdown drain, a disruption budget, the metrics port
//! annotated), and carry a pipeline config that `sluice check` accepts.

use sluice_tests::*;
use std::process::Command;

/// The rendered manifests.
fn rendered() -> String {
    let out = Command::new("kubectl")
        .args(["kustomize"])
        .arg(repo_root().join("deploy/kubernetes"))
        .output()
        .expect("kubectl (Debian package kubectl; scripts/test.sh installs it)");
    assert!(
        out.status.success(),
        "kubectl kustomize: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn kubernetes_manifests_render_validate_and_wire_what_sluice_needs() {
    let yaml = rendered();
    let dir = TempDir::new("deploy");
    let file = dir.path().join("rendered.yaml");
    std::fs::write(&file, &yaml).unwrap();
    let validated = Command::new("kubernetes-validate")
        .arg("--strict")
        .arg(&file)
        .output()
        .expect("kubernetes-validate (PyPI; scripts/test.sh installs it)");
    let said = String::from_utf8_lossy(&validated.stdout).into_owned()
        + &String::from_utf8_lossy(&validated.stderr);
    assert!(validated.status.success(), "{said}");
    for kind in [
        "configmap/",
        "secret/",
        "service/",
        "statefulset/",
        "poddisruptionbudget/",
    ] {
        assert!(
            said.contains(&format!("passed for resource {kind}")),
            "{said}"
        );
    }
    for wired in [
        "fieldPath: metadata.name",
        "name: SLUICE_INSTANCE_ID",
        "name: PG_PASSWORD",
        "name: SLUICE_CONTROL_TOKEN",
        "path: /healthz",
        "path: /readyz",
        "terminationGracePeriodSeconds: 120",
        "prometheus.io/port: \"7878\"",
        "maxUnavailable: 1",
        "readOnlyRootFilesystem: true",
    ] {
        assert!(yaml.contains(wired), "`{wired}` missing:\n{yaml}");
    }
    assert!(!yaml.contains("password=") && !yaml.contains(":change-me@"));
}

/// The ConfigMap's pipeline passes `sluice check` with its secret from the
/// environment (the module path pointed at the repo's build of the same
/// module), and without it names the variable.
#[test]
fn the_kubernetes_pipeline_config_passes_check() {
    let source = repo_root().join("deploy/kubernetes/pipeline.toml");
    let dir = TempDir::new("deploy-check");
    let text = std::fs::read_to_string(source)
        .unwrap()
        .replace(
            "/opt/sluice/modules/word-count.wasm",
            &plugin("word-count").display().to_string(),
        )
        .replace(
            "/var/cache/sluice",
            &dir.path().join("cache").display().to_string(),
        );
    let config = dir.path().join("pipeline.toml");
    std::fs::write(&config, text).unwrap();
    let check = |password: Option<&str>| {
        let mut command = Command::new(sluice_bin());
        command.arg("check").arg(&config).env_remove("PG_PASSWORD");
        if let Some(p) = password {
            command.env("PG_PASSWORD", p);
        }
        command.output().unwrap()
    };
    let ok = check(Some("from-the-secret"));
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let missing = check(None);
    let said = String::from_utf8_lossy(&missing.stderr);
    assert!(
        !missing.status.success() && said.contains("environment variable `PG_PASSWORD` is not set"),
        "{said}"
    );
}
