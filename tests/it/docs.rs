//! Every command the README, docs/ and the chart's README show in a shell block is run here, or
//! named with the test or script that runs it; a command added to them that nothing runs fails
//! this test, and so does a `cargo test --test NAME FILTER` in them that names no test.

use crate::support;

use std::path::Path;

use crate::support::fixtures::{Kind, Workload, create_configmap};
use crate::support::scenario::scenario;

/// How a shown command is checked.
enum Check {
    /// Run as shown against the local control plane: `reloader` is the binary built here, the
    /// namespace (`-n`) the test's, a values file Reloader's defaults, helm's install a
    /// server-side dry run.
    Run,
    /// Run by this test or script instead, named so that it can be found.
    By(&'static str),
}

/// Each command as the docs show it (comments dropped, continuation lines joined), and how
/// it is checked.
fn how(command: &str) -> Option<Check> {
    use Check::{By, Run};
    let check = match command {
        "hack/test" => By(".ci/run (CI runs it)"),
        "hack/demo" => By("hack/test (runs the demo after the tests)"),
        "hack/image" => By("hack/test (builds the image before the tests)"),
        "hack/image --arch all" => By(".github/workflows/release.yml (builds both arches on a tag)"),
        c if c.starts_with("docker build") || c.starts_with("docker buildx") => {
            By("hack/image (builds the same Dockerfile with buildah)")
        }
        "hack/cluster status" => Run,
        c if c.starts_with("hack/cluster") => By("hack/test (brings the control plane up, and down if it started it)"),
        c if c.starts_with("reloader explain") || c == "reloader fleet status" => Run,
        c if c.starts_with("helm upgrade --install reloader ./charts/reloader") => Run,
        c if c.starts_with("helm upgrade reloader ./charts/reloader") => {
            By("tests/it/migrating.rs upgrading_reloaders_release_in_place_rolls_nothing_then_reloads_and_rolls_back")
        }
        c if c.starts_with("$(hack/tools helm) upgrade --install reloader ./charts/reloader") => {
            By("tests/it/chart.rs helm_install_of_a_fleet_reloads_with_the_releases_rbac")
        }
        c if c.starts_with("curl") && c.contains("/explain/") => By("hack/demo (curls /explain on the admin address)"),
        c if c.starts_with("curl") || c.starts_with("kubectl -n reloader port-forward") => {
            By("tests/it/reload_flags.rs the_data_views_answer_on_the_admin_address_only")
        }
        _ => return None,
    };
    Some(check)
}

/// The shell commands of the fenced `sh` blocks of `text`.
fn commands(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_block = false;
    let mut pending = String::new();
    for line in text.lines() {
        if line.starts_with("```") {
            in_block = !in_block && line.trim_start_matches('`') == "sh";
            continue;
        }
        if !in_block {
            continue;
        }
        let code = strip_comment(line).trim_end();
        if let Some(continued) = code.strip_suffix('\\') {
            pending.push_str(continued.trim());
            pending.push(' ');
            continue;
        }
        pending.push_str(code.trim());
        let command = std::mem::take(&mut pending).split_whitespace().collect::<Vec<_>>().join(" ");
        if !command.is_empty() {
            out.push(command);
        }
    }
    out
}

/// The line without a trailing `# comment` (a `#` outside quotes, after a space).
fn strip_comment(line: &str) -> &str {
    let mut quoted = None;
    let mut previous = ' ';
    for (i, c) in line.char_indices() {
        match (quoted, c) {
            (None, '\'' | '"') => quoted = Some(c),
            (Some(q), c) if c == q => quoted = None,
            (None, '#') if previous.is_whitespace() => return &line[..i],
            _ => {}
        }
        previous = c;
    }
    line
}

fn documents() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut paths = vec![root.join("README.md"), root.join("charts/README.md")];
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs")).expect("docs/").flatten().map(|e| e.path()).collect();
    docs.sort();
    paths.extend(docs.into_iter().filter(|p| p.extension().is_some_and(|e| e == "md")));
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p.strip_prefix(root).unwrap_or(&p).display().to_string(), text)
        })
        .collect()
}

#[test]
fn commands_are_read_from_shell_blocks_without_their_comments() {
    let text = "```sh\nhack/x --a   # a comment\nhelm up \\\n  --set a=b   # more\n```\n```yaml\nk: v\n```\n";
    assert_eq!(commands(text), ["hack/x --a", "helm up --set a=b"]);
    assert_eq!(strip_comment("curl 'localhost/x?a#b'  # c"), "curl 'localhost/x?a#b'  ");
}

/// Every command shown has a way it is checked, and each one named as run elsewhere names a
/// test or script that exists.
#[test]
fn every_shown_command_is_run_by_a_test_or_a_script() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut unchecked = Vec::new();
    for (doc, text) in documents() {
        for command in commands(&text) {
            match how(&command) {
                None => unchecked.push(format!("{doc}: {command}")),
                Some(Check::By(by)) => {
                    let (file, test) = by.split_once(' ').map_or((by, None), |(f, rest)| (f, rest.split(' ').next()));
                    let source =
                        std::fs::read_to_string(root.join(file)).unwrap_or_else(|_| panic!("{doc}: {by}: no {file}"));
                    if let Some(test) = test.filter(|t| t.chars().all(|c| c.is_ascii_lowercase() || c == '_')) {
                        assert!(source.contains(&format!("fn {test}(")), "{doc}: {command}: {file} has no test {test}");
                    }
                }
                Some(Check::Run) => {}
            }
        }
    }
    assert!(
        unchecked.is_empty(),
        "commands in the docs that nothing runs (add them to `how`):\n{}",
        unchecked.join("\n")
    );
}

/// `cargo test --test NAME [FILTER] [-- FILTER...]` in the docs: NAME is a test target (`it`,
/// whose modules are the subjects, or `outages`) and each FILTER matches one of its tests by
/// path (`fleet::handoff` matches `fleet::handoff_times_with_default_lease_timings`).
#[test]
fn every_test_command_in_the_docs_names_a_test() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tests_of = |target: &str| -> Vec<String> {
        let files: Vec<(String, std::path::PathBuf)> = match target {
            "it" => std::fs::read_dir(root.join("tests/it"))
                .expect("tests/it")
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "rs") && !p.ends_with("main.rs"))
                .map(|p| (format!("{}::", p.file_stem().unwrap_or_default().to_string_lossy()), p))
                .collect(),
            other => vec![(String::new(), root.join("tests").join(format!("{other}.rs")))],
        };
        files
            .into_iter()
            .flat_map(|(module, path)| {
                let source = std::fs::read_to_string(&path).unwrap_or_default();
                source
                    .lines()
                    .filter_map(|l| {
                        l.trim_start().strip_prefix("fn ").or_else(|| l.trim_start().strip_prefix("async fn "))
                    })
                    .filter_map(|l| l.split('(').next())
                    .map(|name| format!("{module}{name}"))
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let mut found = 0;
    for (doc, text) in documents() {
        for cell in text.split('`').skip(1).step_by(2).filter(|c| c.starts_with("cargo test --test ")) {
            let words: Vec<&str> = cell.split_whitespace().collect();
            let targets: Vec<&str> =
                words.windows(2).filter(|w| w[0] == "--test").map(|w| w[1].trim_end_matches(',')).collect();
            let tests: Vec<String> = targets.iter().flat_map(|t| tests_of(t)).collect();
            assert!(!tests.is_empty(), "{doc}: `{cell}`: no tests in {targets:?}");
            let filters = words
                .iter()
                .enumerate()
                .filter(|(i, w)| *i > 1 && !w.starts_with('-') && words[i - 1] != "--test" && **w != "test")
                .map(|(_, w)| *w);
            for filter in filters {
                assert!(
                    tests.iter().any(|t| t.contains(filter)),
                    "{doc}: `{cell}`: no test of {targets:?} has {filter:?} in its path"
                );
            }
            found += 1;
        }
    }
    assert!(found > 10, "only {found} test commands found: is the parsing right?");
}

/// The commands marked [`Check::Run`], run: explain and fleet status on objects like the docs',
/// helm's install of the chart as a server-side dry run, the control plane's status.
#[tokio::test]
async fn the_commands_shown_run() {
    let shown: Vec<String> = documents()
        .into_iter()
        .flat_map(|(_, text)| commands(&text))
        .filter(|c| matches!(how(c), Some(Check::Run)))
        .collect();
    scenario("docs", reloader_fleet::reload::Strategy::EnvVars, &[], |ctx, controller| async move {
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        create_configmap(c, ns, "app-config", &[("mode", "a")]).await;
        Workload::new(Kind::Deployment, "web").auto().env_from_configmap("app-config").create(c, ns).await;
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let values = root.join("charts/reloader/tests/values/v1-defaults.yaml");
        let helm = support::tool("helm");
        for command in &shown {
            let mut words: Vec<String> = command.split_whitespace().map(str::to_string).collect();
            for i in 0..words.len() {
                let replacement = match words[i].as_str() {
                    _ if i > 0 && words[i - 1] == "-n" => ns.to_string(),
                    "your-reloader-values.yaml" | "their-values.yaml" | "values.yaml" => values.display().to_string(),
                    w if w.contains("<registry>/") => w.replace("<registry>/", ""),
                    w => w.to_string(),
                };
                words[i] = replacement;
            }
            let (program, args) = match words[0].as_str() {
                "reloader" => (env!("CARGO_BIN_EXE_reloader").to_string(), words[1..].to_vec()),
                "helm" => {
                    let mut args = words[1..].to_vec();
                    args.extend(["--dry-run=server".to_string(), "--kubeconfig".to_string()]);
                    args.push(support::kubeconfig_path().display().to_string());
                    (helm.display().to_string(), args)
                }
                other => (root.join(other).display().to_string(), words[1..].to_vec()),
            };
            let output = tokio::process::Command::new(&program)
                .args(&args)
                .current_dir(root)
                .env("KUBECONFIG", support::kubeconfig_path())
                .output()
                .await
                .unwrap_or_else(|e| panic!("{command}: cannot run {program}: {e}"));
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(output.status.success(), "`{command}` (as {program} {args:?}) failed: {stderr}");
            println!("ran `{command}`");
        }
        controller
    })
    .await;
}
