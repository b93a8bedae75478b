use std::ffi::OsString;
use std::time::Duration;

use clap::Parser;

use super::values::{csv_items, parse_addr, split_csv};
use super::*;
use crate::watch::WorkloadKind;

fn args(extra: &[&str]) -> Args {
    Args::try_parse_from(std::iter::once("reloader").chain(extra.iter().copied())).expect("valid flags")
}

#[test]
fn sources_name_the_flag_or_the_file() {
    let argv = ["reloader", "--namespaces=a"].map(OsString::from).to_vec();
    let args = with_sources(argv, 0, "").expect("valid flags");
    assert_eq!(args.sources["namespaces"], "flag --namespaces");
    assert_eq!(args.sources["shards"], "the default of --shards");
    // The file's arguments come first; the command line repeats one and wins.
    let argv = ["reloader", "--shards=4", "--namespaces=a", "--namespaces=b"].map(OsString::from).to_vec();
    let args = with_sources(argv, 2, "fleet.yaml").expect("valid flags");
    assert_eq!(args.sources["shards"], "config file fleet.yaml");
    assert_eq!(args.sources["namespaces"], "flag --namespaces");
}

#[test]
fn v1_spellings_and_string_typed_flags_parse() {
    let a = args(&["--is-Argo-Rollouts=true", "--reload-on-create=true", "--reload-on-delete", "yes"]);
    assert_eq!(a.watch.is_argo_rollouts, "true");
    assert_eq!(a.reload.reload_on_create, "true");
    assert_eq!(a.reload.reload_on_delete, "yes", "string flags keep any value; only \"true\" enables");
}

#[test]
fn bool_flags_take_go_spellings_and_bare_form() {
    assert!(args(&["--auto-reload-all"]).reload.auto_reload_all);
    assert!(args(&["--auto-reload-all=True"]).reload.auto_reload_all);
    assert!(!args(&["--auto-reload-all=0"]).reload.auto_reload_all);
    assert!(Args::try_parse_from(["reloader", "--auto-reload-all=yes"]).is_err());
}

#[test]
fn fleet_status_takes_its_settings_after_the_command_as_people_type_them() {
    let a = args(&["fleet", "status", "--shards", "16", "--leader-election-namespace", "reloader"]);
    assert_eq!((a.fleet.shards, a.fleet.leader_election_namespace.as_str()), (16, "reloader"));
    assert!(matches!(a.command, Some(Command::Fleet { what: FleetCommand::Status })));
}

#[test]
fn explain_takes_kubectl_style_arguments_and_the_controllers_flags_after_it() {
    let a = args(&["explain", "deploy/web", "-n", "team-a", "-o", "json", "--auto-reload-all"]);
    assert!(a.reload.auto_reload_all);
    let Some(Command::Explain { target, namespace, output }) = a.command else { panic!("explain expected") };
    assert_eq!((target.as_str(), namespace.as_deref(), output.as_str()), ("deploy/web", Some("team-a"), "json"));
    assert!(Args::try_parse_from(["reloader", "explain", "deploy/web", "-o", "yaml"]).is_err());
}

#[test]
fn slices_split_on_commas_and_repeat() {
    let a = args(&["--namespaces-to-ignore=a,b", "--namespaces-to-ignore=c"]);
    assert_eq!(csv_items(&a.watch.namespaces_to_ignore), vec!["a", "b", "c"]);
}

#[test]
fn set_selectors_survive_comma_splitting() {
    let a = args(&["--namespace-selector=env in (prod,qa),team=x"]);
    let s = a.settings().expect("valid").watch.filter.selector.expect("set");
    let labels = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    assert!(s.matches(&labels(&[("env", "qa"), ("team", "x")])));
    assert!(!s.matches(&labels(&[("env", "dev"), ("team", "x")])));
}

#[test]
fn invalid_values_name_the_flag() {
    let bad = |flags: &[&str], needle: &str| {
        let err = args(flags).settings().err().map(|e| format!("{e:#}")).unwrap_or_default();
        assert!(err.contains(needle), "{flags:?}: {err}");
    };
    bad(&["--resources-to-ignore=configmaps,secrets"], "--resources-to-ignore");
    bad(&["--resources-to-ignore=pods"], "--resources-to-ignore");
    bad(&["--ignored-workload-types=pods"], "--ignored-workload-types");
    bad(&["--is-openshift=maybe"], "--is-openshift");
    bad(&["--namespace-selector=team in x"], "--namespace-selector");
    bad(&["--log-format=xml"], "--log-format");
    bad(&["--webhook-url=not a url"], "--webhook-url");
    bad(&["--alert-on-reload"], "ALERT_WEBHOOK_URL");
    bad(&["--alert-on-reload", "--alert-webhook-url=ftp://x/y"], "ALERT_WEBHOOK_URL");
    bad(&["--alert-on-reload", "--alert-webhook-url=http://x/y", "--alert-sink=pager"], "ALERT_SINK");
    bad(&["--alert-proxy=::"], "ALERT_PROXY");
    bad(&["--enable-pprof", "--pprof-addr=nowhere"], "--pprof-addr");
    bad(&["--namespaces=Bad_NS"], "DNS-1123");
    bad(&["--leader-election-renew-deadline=20s"], "leader election");
    bad(&["--leader-election-retry-period=0s"], "leader election");
    let strategy = Args::try_parse_from(["reloader", "--reload-strategy=rolling"]).expect_err("rejected");
    assert!(strategy.to_string().contains("env-vars, annotations"));
}

#[test]
fn values_that_panicked_are_start_up_errors() {
    // Regression: each of these reached a timer or a float-to-Duration conversion and
    // panicked at start or at the first change.
    for flags in [
        ["--coalesce-window=20000h"],
        ["--coalesce-window=99999999999999999999999h"],
        ["--kube-api-qps=1e-300"],
        ["--max-rollouts-per-second=0.000001"],
        ["--max-rollouts-per-second=NaN"],
        ["--kube-api-qps=inf"],
        ["--leader-election-lease-duration=100000h"],
        ["--flap-damping-window=2h"],
        ["--flap-damping-window=100ms"],
        ["--flap-damping-changes=-1"],
        ["--hash=md5"],
    ] {
        let err = Args::try_parse_from(std::iter::once("reloader").chain(flags)).expect_err("refused");
        assert!(err.to_string().contains(flags[0].split('=').next().unwrap_or_default()), "{err}");
    }
    assert_eq!(args(&["--coalesce-window=1h"]).reload.coalesce_window, Duration::from_secs(3600));
    assert_eq!(args(&["--max-rollouts-per-second=0.5"]).reload.max_rollouts_per_second, 0.5);
}

#[test]
fn the_hash_is_reloaders_sha1_unless_sha512_256_is_chosen() {
    use crate::watch::HashForm;
    assert_eq!(args(&[]).settings().expect("valid").watch.hash, HashForm::Sha1);
    assert_eq!(args(&["--hash=sha512-256"]).settings().expect("valid").watch.hash, HashForm::Sha512_256);
}

#[test]
fn flap_damping_is_off_by_default_and_on_with_a_threshold() {
    let pacing = |flags: &[&str]| args(flags).settings().expect("valid").reload.pacing.flap_damping;
    assert_eq!(pacing(&[]), None);
    assert_eq!(pacing(&["--flap-damping-window=10s"]), None, "a window alone turns nothing on");
    let on = pacing(&["--flap-damping-changes=5"]).expect("on");
    assert_eq!((on.changes, on.window), (5, Duration::from_secs(60)), "a minute unless set");
    let on = pacing(&["--flap-damping-changes=3", "--flap-damping-window=30s"]).expect("on");
    assert_eq!((on.changes, on.window), (3, Duration::from_secs(30)));
}

#[test]
fn list_flags_read_csv_as_pflag_does() {
    assert_eq!(split_csv("a,b"), Ok(vec!["a".to_string(), "b".to_string()]));
    assert_eq!(split_csv("\"team=a,env!=dev\""), Ok(vec!["team=a,env!=dev".to_string()]));
    assert_eq!(split_csv("\"x\"\"y\",z"), Ok(vec!["x\"y".to_string(), "z".to_string()]));
    assert_eq!(split_csv("a,"), Ok(vec!["a".to_string(), String::new()]));
    assert_eq!(split_csv(""), Ok(vec![]));
    assert!(split_csv("\"open").is_err() && split_csv("a\"b").is_err() && split_csv("\"a\"b").is_err());
    // What Reloader's chart renders for reloader.namespaceSelector, taken whole.
    let s = args(&["--namespace-selector=\"env in (prod,qa),team=x\""]).settings().expect("valid").watch.filter;
    let selector = s.selector.expect("set");
    let labels = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    assert!(selector.matches(&labels(&[("env", "qa"), ("team", "x")])));
    assert!(Args::try_parse_from(["reloader", "--namespaces=\"a"]).is_err());
}

#[test]
fn resources_to_ignore_is_case_insensitive() {
    let s = args(&["--resources-to-ignore=ConfigMaps"]).settings().expect("valid");
    assert!(!s.watch.configmaps && s.watch.secrets);
}

#[test]
fn the_data_views_listen_on_loopback_unless_told_otherwise() {
    let admin = |flags: &[&str]| args(flags).settings().expect("valid").serving.admin_addr;
    let default = admin(&[]).expect("on by default");
    assert!(default.ip().is_loopback(), "{default}");
    assert_eq!(admin(&["--admin-addr="]), None);
    assert_eq!(admin(&["--admin-addr=:9091"]).map(|a| a.ip().is_unspecified()), Some(true));
    assert!(args(&["--admin-addr=nowhere"]).settings().is_err());
}

#[test]
fn addresses_use_go_forms() {
    assert_eq!(parse_addr(":9090").map(|a| a.port()), Ok(9090));
    assert!(parse_addr("nowhere").is_err());
}

#[test]
fn ignored_workload_types_remove_watched_kinds() {
    let s = args(&["--ignored-workload-types=Deployments,daemonset,jobs,CronJob,rollouts"]).settings().expect("valid");
    assert_eq!(s.watch.workload_kinds, vec![WorkloadKind::StatefulSet, WorkloadKind::DeploymentConfig]);
}

#[test]
fn annotation_overrides_reach_the_keys() {
    let s = args(&["--auto-annotation=example.com/auto"]).settings().expect("valid");
    assert_eq!(s.reload.keys.auto, "example.com/auto");
}

/// Every flag's spelling, value, default and environment variable, as `reloader --help` prints
/// them, is the committed one: a flag renamed or dropped by accident (Reloader's spellings are a
/// contract) fails here. After a deliberate change, `REGENERATE_GOLDEN=1 cargo test --lib
/// cli::tests::the_help` writes it again; review the diff.
#[test]
fn the_help_is_the_committed_one() {
    use clap::CommandFactory;
    let help = Args::command().render_help().to_string();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/help.txt");
    if std::env::var_os("REGENERATE_GOLDEN").is_some() {
        std::fs::write(path, &help).expect("write the golden help");
    }
    let golden = std::fs::read_to_string(path).unwrap_or_default();
    let differ: Vec<String> = diff_lines(&golden, &help);
    assert!(differ.is_empty(), "`reloader --help` is not {path}:\n{}", differ.join("\n"));
}

/// The lines only one of the two texts has, marked `-` (only in `old`) or `+`.
fn diff_lines(old: &str, new: &str) -> Vec<String> {
    let gone = old.lines().filter(|l| !new.lines().any(|n| n == *l)).map(|l| format!("- {l}"));
    let came = new.lines().filter(|l| !old.lines().any(|o| o == *l)).map(|l| format!("+ {l}"));
    gone.chain(came).collect()
}
