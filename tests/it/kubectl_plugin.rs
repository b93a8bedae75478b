//! Issue 53: installed as `kubectl-reloader` (krew's manifest: `.krew.yaml`), the binary is a
//! kubectl plugin: `kubectl reloader explain ...` and `kubectl reloader fleet status` run with
//! the user's kubeconfig and name themselves so; shell completions and a manual page come from
//! the same clap definitions.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::support::fixtures::create_configmap;
use crate::support::with_temp_ns;
use serde_json::Value;

/// A folder holding the binary as `kubectl-reloader`, as krew installs it.
fn plugin_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("krew-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("plugin folder");
    let link = dir.join("kubectl-reloader");
    if !link.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_reloader"), &link).expect("link kubectl-reloader");
    }
    dir
}

/// `kubectl <args>` with the plugin on PATH and the test cluster's kubeconfig.
fn kubectl(dir: &Path, args: &[&str]) -> Output {
    let path = format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default());
    Command::new(support::tool("kubectl"))
        .args(args)
        .env("PATH", path)
        .env("KUBECONFIG", support::kubeconfig_path())
        .output()
        .expect("run kubectl")
}

fn stdout(out: &Output) -> String {
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn kubectl_runs_the_binary_as_its_reloader_plugin() {
    with_temp_ns("kubectl-plugin", |client, ns| async move {
        let dir = plugin_dir();
        let listed = stdout(&kubectl(&dir, &["plugin", "list"]));
        assert!(listed.contains("kubectl-reloader"), "{listed}");
        let help = stdout(&kubectl(&dir, &["reloader", "explain", "--help"]));
        assert!(help.contains("Usage: kubectl reloader explain"), "{help}");

        create_configmap(&client, &ns, "settings", &[("k", "v")]).await;
        let report = stdout(&kubectl(&dir, &["reloader", "explain", "configmap/settings", "-n", &ns, "-o", "json"]));
        let report: Value = serde_json::from_str(&report).expect("explain's JSON");
        assert_eq!(report["found"], true, "{report:#}");
        let text = stdout(&kubectl(&dir, &["reloader", "explain", "cm/missing", "-n", &ns]));
        assert!(text.contains("missing"), "{text}");
        let status = stdout(&kubectl(&dir, &["reloader", "fleet", "status"]));
        assert!(!status.trim().is_empty());
        // A wrong kind is an error from the plugin, passed on by kubectl.
        let wrong = kubectl(&dir, &["reloader", "explain", "pod/x", "-n", &ns]);
        assert!(!wrong.status.success() && String::from_utf8_lossy(&wrong.stderr).contains("unknown kind"));
    })
    .await;
}

#[test]
fn completions_load_in_bash_and_the_manual_page_lists_every_flag() {
    let dir = plugin_dir();
    let plugin = dir.join("kubectl-reloader");
    let script = Command::new(&plugin).args(["completions", "bash"]).output().expect("completions");
    let script = stdout(&script);
    let file = dir.join("completion.bash");
    std::fs::write(&file, &script).expect("write the script");
    // Sourced by bash, it registers a completion for the name it was called by.
    let source = format!("source {} && complete -p kubectl-reloader", file.display());
    let loaded = stdout(&Command::new("bash").arg("-c").arg(source).output().expect("bash"));
    assert!(loaded.contains("kubectl-reloader"), "{loaded}");
    for word in ["explain", "fleet", "--reload-strategy", "--shards"] {
        assert!(script.contains(word), "the bash completion lacks {word}");
    }

    let page = stdout(&Command::new(env!("CARGO_BIN_EXE_reloader")).arg("man").output().expect("man"));
    assert!(page.starts_with(".ie") && page.contains(".TH reloader 1"), "{}", &page[..page.len().min(200)]);
    let help = stdout(&Command::new(env!("CARGO_BIN_EXE_reloader")).arg("--help").output().expect("--help"));
    let flags = help.split_whitespace().filter(|w| w.starts_with("--")).map(|w| w.trim_end_matches(',').to_string());
    for flag in flags {
        let roff = flag.replace('-', "\\-");
        assert!(page.contains(&roff), "the manual page lacks {flag}");
    }
}

/// `.krew.yaml` filled in as krew-release-bot fills it for tag `tag`: each `addURIAndSha`
/// becomes the archive's `uri` and a `sha256`.
fn krew_manifest(tag: &str) -> String {
    let template = include_str!("../../.krew.yaml").replace("{{ .TagName }}", tag);
    template
        .lines()
        .map(|line| match line.trim_start().strip_prefix("{{addURIAndSha \"") {
            Some(rest) => {
                let indent = &line[..line.len() - line.trim_start().len()];
                let uri = rest.split('"').next().unwrap_or_default();
                format!("{indent}uri: {uri}\n{indent}sha256: {}", "0".repeat(64))
            }
            None => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The krew manifest installs the release's archive for each platform as `kubectl-reloader`,
/// the archives the release workflow uploads.
#[test]
fn the_krew_manifest_names_the_plugin_for_each_released_platform() {
    let manifest: Value = serde_saphyr::from_str(&krew_manifest("v1.2.3")).expect("the krew manifest is YAML");
    assert_eq!(manifest["spec"]["version"], "v1.2.3");
    let workflow = include_str!("../../.github/workflows/release.yml");
    assert_eq!(manifest["kind"], "Plugin");
    assert_eq!(manifest["metadata"]["name"], "reloader");
    let platforms = manifest["spec"]["platforms"].as_array().expect("platforms");
    let mut arches: Vec<&str> = platforms
        .iter()
        .map(|p| {
            assert_eq!(p["bin"], "kubectl-reloader", "{p}");
            assert_eq!(p["selector"]["matchLabels"]["os"], "linux", "{p}");
            let uri = p["uri"].as_str().expect("uri");
            let arch = p["selector"]["matchLabels"]["arch"].as_str().expect("arch");
            let archive = uri.rsplit('/').next().expect("an archive name").replace("v1.2.3", "${TAG}");
            let archive = archive.replace(arch, "${arch}");
            assert!(workflow.contains(&archive), "the release workflow uploads no {archive}");
            p["selector"]["matchLabels"]["arch"].as_str().expect("arch")
        })
        .collect();
    arches.sort();
    assert_eq!(arches, ["amd64", "arm64"]);
}
