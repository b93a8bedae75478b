//! `reloader explain` run as a user runs it.

use serde_json::Value;

/// Run `reloader explain ARGS...` as a user would; its stdout, failing the test on an error.
pub async fn explain(args: &[&str]) -> String {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_reloader"))
        .arg("explain")
        .args(args)
        .env("KUBECONFIG", super::kubeconfig_path())
        .output()
        .await
        .expect("run reloader explain");
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "reloader explain {args:?} failed: {stderr}");
    stdout.into_owned()
}

pub async fn explain_json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    let text = explain(&all).await;
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("explain printed no JSON ({e}): {text}"))
}
