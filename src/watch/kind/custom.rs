//! Kinds an operator declares at start-up (`--custom-kinds-file`), for custom resources whose
//! pods Reloader cannot roll (Knative Services, VictoriaMetrics' VMAgents, OpenKruise
//! CloneSets...): where the pod template lives, and optionally a field to set on each reload.
//!
//! ```yaml
//! kinds:
//!   - kind: Service
//!     apiVersion: serving.knative.dev/v1
//!     plural: services
//!     template: spec.template           # metadata and spec of the pods below this path
//!   - kind: VMAgent
//!     apiVersion: operator.victoriametrics.com/v1beta1
//!     plural: vmagents
//!     podMetadata: spec.podMetadata     # or the pod's metadata and spec at paths of their own
//!     podSpec: spec
//!     restartField: spec.restartedAt    # optional: set to the reload's time
//! ```
//! Every declared kind is written with a JSON merge patch carrying the resourceVersion (custom
//! resources take no strategic merge), the same write as Argo Rollouts.

use serde::Deserialize;

use super::{DECLARED, KindSpec, PodPlace, WorkloadKind, WriteMethod};
use crate::shard::{is_dns_label, is_dns_subdomain};

/// The largest file read, and the most kinds declared: a typo'd path must not fill memory.
pub const MAX_FILE_BYTES: usize = 64 * 1024;
pub const MAX_KINDS: usize = 32;
const MAX_PATH_STEPS: usize = 10;

#[derive(Debug, thiserror::Error)]
pub enum DeclareError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path} is {size} bytes; at most {MAX_FILE_BYTES} are read")]
    TooLarge { path: String, size: u64 },
    #[error("{path} is not a `kinds:` list of kind declarations: {reason}")]
    Parse { path: String, reason: String },
    #[error("{path}: kind {kind:?}: {reason}")]
    Invalid { path: String, kind: String, reason: String },
    #[error("{path} declares {count} kinds; at most {MAX_KINDS}")]
    TooMany { path: String, count: usize },
    #[error("this process declared other kinds already; it declares one set")]
    Redeclared,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    kinds: Vec<Declaration>,
}

/// One kind as written in the file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Declaration {
    kind: String,
    api_version: String,
    plural: String,
    #[serde(default)]
    template: Option<String>,
    #[serde(default)]
    pod_metadata: Option<String>,
    #[serde(default)]
    pod_spec: Option<String>,
    #[serde(default)]
    restart_field: Option<String>,
}

/// Read, check and declare the kinds of `path`: from here on they are rows of the kind table,
/// watched and rolled like the built-in ones. Declaring the same kinds again is a no-op.
pub fn declare_file(path: &str) -> Result<Vec<WorkloadKind>, DeclareError> {
    let read = |source| DeclareError::Read { path: path.to_string(), source };
    let size = std::fs::metadata(path).map_err(read)?.len();
    if size > MAX_FILE_BYTES as u64 {
        return Err(DeclareError::TooLarge { path: path.to_string(), size });
    }
    let text = std::fs::read_to_string(path).map_err(read)?;
    declare(&parse(path, &text)?)
}

/// A declared kind, checked, before it is a row of the kind table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub kind: String,
    pub group: String,
    pub version: String,
    pub plural: String,
    pod: Place,
    restart_field: Option<Vec<String>>,
}

/// [`PodPlace`], owned.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Place {
    Template(Vec<String>),
    Split { metadata: Vec<String>, spec: Vec<String> },
}

impl Row {
    /// The table row: its strings live as long as the process (declared once, at start-up,
    /// from at most [`MAX_FILE_BYTES`]), as the built-in rows' do.
    fn leak(&self) -> KindSpec {
        let pod = match &self.pod {
            Place::Template(path) => PodPlace::Template(leak_path(path)),
            Place::Split { metadata, spec } => PodPlace::Split { metadata: leak_path(metadata), spec: leak_path(spec) },
        };
        KindSpec {
            kind: leak(&self.kind),
            group: leak(&self.group),
            version: leak(&self.version),
            plural: leak(&self.plural),
            pod,
            write: WriteMethod::MergePatch,
            records_in_metadata: false,
            restart_field: self.restart_field.as_deref().map(leak_path),
        }
    }

    /// Whether `spec` is this row (declaring the same file again is no change).
    fn is(&self, spec: &KindSpec) -> bool {
        let same = |owned: &[String], path: &[&str]| owned.iter().map(String::as_str).eq(path.iter().copied());
        let pod = match (&self.pod, spec.pod) {
            (Place::Template(mine), PodPlace::Template(theirs)) => same(mine, theirs),
            (Place::Split { metadata, spec: pod_spec }, PodPlace::Split { metadata: m, spec: s }) => {
                same(metadata, m) && same(pod_spec, s)
            }
            _ => false,
        };
        let restart = match (&self.restart_field, spec.restart_field) {
            (Some(mine), Some(theirs)) => same(mine, theirs),
            (mine, theirs) => mine.is_none() && theirs.is_none(),
        };
        pod && restart
            && (self.kind.as_str(), self.group.as_str(), self.version.as_str(), self.plural.as_str())
                == (spec.kind, spec.group, spec.version, spec.plural)
    }
}

/// The rows `text` declares, checked; nothing is declared yet.
pub fn parse(path: &str, text: &str) -> Result<Vec<Row>, DeclareError> {
    let parse_error = |reason: String| DeclareError::Parse { path: path.to_string(), reason };
    let file: File = config::Config::builder()
        .add_source(config::File::from_str(text, config::FileFormat::Yaml))
        .build()
        .and_then(config::Config::try_deserialize)
        .map_err(|e| parse_error(e.to_string()))?;
    if file.kinds.len() > MAX_KINDS {
        return Err(DeclareError::TooMany { path: path.to_string(), count: file.kinds.len() });
    }
    let mut rows: Vec<Row> = Vec::with_capacity(file.kinds.len());
    for declaration in file.kinds {
        let invalid =
            |reason: String| DeclareError::Invalid { path: path.to_string(), kind: declaration.kind.clone(), reason };
        let row = row(&declaration).map_err(invalid)?;
        let builtin = WorkloadKind::ALL.iter().map(|k| k.spec()).map(|s| (s.kind, s.group, s.version));
        let declared = rows.iter().map(|r| (r.kind.as_str(), r.group.as_str(), r.version.as_str()));
        if let Some((kind, group, version)) = builtin.chain(declared).find(|o| o.0.eq_ignore_ascii_case(&row.kind)) {
            return Err(invalid(format!(
                "the kind name is taken by {group}/{version} {kind}: kinds are named by their kind in metrics, Events \
                 and --ignored-workload-types"
            )));
        }
        rows.push(row);
    }
    Ok(rows)
}

/// Store `rows` as the declared kinds of this process.
fn declare(rows: &[Row]) -> Result<Vec<WorkloadKind>, DeclareError> {
    let stored = DECLARED.get_or_init(|| rows.iter().map(Row::leak).collect());
    if stored.len() != rows.len() || !rows.iter().zip(stored).all(|(row, spec)| row.is(spec)) {
        return Err(DeclareError::Redeclared);
    }
    Ok((0..stored.len()).filter_map(|n| u8::try_from(n).ok()).map(WorkloadKind::Custom).collect())
}

fn row(d: &Declaration) -> Result<Row, String> {
    let kind_ok = !d.kind.is_empty()
        && d.kind.len() <= 63
        && d.kind.starts_with(|c: char| c.is_ascii_uppercase())
        && d.kind.chars().all(|c| c.is_ascii_alphanumeric());
    if !kind_ok {
        return Err("`kind` must be a Kubernetes kind: a capital letter, then letters and digits".into());
    }
    let (group, version) = d.api_version.split_once('/').ok_or_else(|| {
        format!("`apiVersion` {:?} must be group/version: custom resources have a group", d.api_version)
    })?;
    if !is_dns_subdomain(group) || !group.contains('.') {
        return Err(format!("the group {group:?} of `apiVersion` is not a DNS subdomain with a dot"));
    }
    if !is_dns_label(version) {
        return Err(format!("the version {version:?} of `apiVersion` is not a DNS label"));
    }
    if !is_dns_label(&d.plural) {
        return Err(format!("`plural` {:?} must be the lowercase resource name (a DNS label)", d.plural));
    }
    let pod = match (&d.template, &d.pod_metadata, &d.pod_spec) {
        (Some(template), None, None) => Place::Template(spec_path("template", template)?),
        (None, Some(metadata), Some(spec)) => {
            Place::Split { metadata: spec_path("podMetadata", metadata)?, spec: spec_path("podSpec", spec)? }
        }
        _ => return Err("give either `template`, or both `podMetadata` and `podSpec`".into()),
    };
    let restart_field = match &d.restart_field {
        Some(field) => Some(spec_path("restartField", field)?).filter(|p| !p.is_empty()),
        None => None,
    };
    if d.restart_field.is_some() && restart_field.is_none() {
        return Err("`restartField` must name a field below `spec`".into());
    }
    Ok(Row {
        kind: d.kind.clone(),
        group: group.to_string(),
        version: version.to_string(),
        plural: d.plural.clone(),
        pod,
        restart_field,
    })
}

/// A dotted path that starts at `spec` (`spec.template`), as the steps below `spec`.
fn spec_path(field: &str, path: &str) -> Result<Vec<String>, String> {
    let steps: Vec<&str> = path.split('.').collect();
    let bad = || {
        format!(
            "`{field}` {path:?} must be a dotted path from `spec` (spec.template), of at most {MAX_PATH_STEPS} \
             field names"
        )
    };
    if steps.first() != Some(&"spec") || steps.len() > MAX_PATH_STEPS {
        return Err(bad());
    }
    let named = |s: &&str| !s.is_empty() && s.len() <= 63 && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !steps.iter().all(named) {
        return Err(bad());
    }
    Ok(steps[1..].iter().map(|s| s.to_string()).collect())
}

fn leak(text: &str) -> &'static str {
    Box::leak(text.to_string().into_boxed_str())
}

fn leak_path(path: &[String]) -> &'static [&'static str] {
    let steps: Vec<&'static str> = path.iter().map(|s| leak(s)).collect();
    Box::leak(steps.into_boxed_slice())
}

/// Declare the kinds the unit tests use (Knative's Service as `Custom(0)`, VictoriaMetrics'
/// VMAgent as `Custom(1)`): one set per test process, so every test declares these.
#[cfg(test)]
pub fn declare_for_tests() -> Vec<WorkloadKind> {
    declare(&parse("kinds.yaml", tests::TWO).expect("the test kinds")).expect("declared")
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) const TWO: &str = "kinds:
  - kind: Service
    apiVersion: serving.knative.dev/v1
    plural: services
    template: spec.template
  - kind: VMAgent
    apiVersion: operator.victoriametrics.com/v1beta1
    plural: vmagents
    podMetadata: spec.podMetadata
    podSpec: spec
    restartField: spec.restartedAt
";

    #[test]
    fn a_template_path_or_split_pod_paths_make_rows() {
        let rows: Vec<KindSpec> = parse("kinds.yaml", TWO).expect("two kinds").iter().map(Row::leak).collect();
        assert_eq!(rows[0].kind, "Service");
        assert_eq!(rows[0].group, "serving.knative.dev");
        assert_eq!(rows[0].pod, PodPlace::Template(&["template"]));
        assert_eq!(rows[0].restart_field, None);
        assert_eq!(rows[1].version, "v1beta1");
        assert_eq!(rows[1].pod, PodPlace::Split { metadata: &["podMetadata"], spec: &[] });
        assert_eq!(rows[1].restart_field, Some(&["restartedAt"][..]));
        assert!(rows.iter().all(|r| r.write == WriteMethod::MergePatch));
        let again = parse("kinds.yaml", TWO).expect("two kinds");
        assert!(again.iter().zip(&rows).all(|(row, spec)| row.is(spec)), "a row is its table row");
        assert!(!again[0].is(&rows[1]));
    }

    fn error_of(text: &str) -> String {
        parse("kinds.yaml", text).expect_err("refused").to_string()
    }

    #[test]
    fn mistakes_are_refused_with_what_is_wrong() {
        let one = |fields: &str| format!("kinds:\n  - kind: Thing\n    plural: things\n{fields}");
        let cases = [
            (one("    apiVersion: v1\n    template: spec.template\n"), "must be group/version"),
            (one("    apiVersion: example.com/v1\n"), "either `template`"),
            (one("    apiVersion: example.com/v1\n    template: template\n"), "dotted path from `spec`"),
            (one("    apiVersion: example.com/v1\n    template: spec..x\n"), "dotted path from `spec`"),
            (one("    apiVersion: example.com/v1\n    template: spec.t\n    podSpec: spec\n"), "either `template`"),
            (one("    apiVersion: example.com/v1\n    template: spec.t\n    restartField: spec\n"), "restartField"),
            (one("    apiVersion: example.com/v1\n    template: spec.t\n    pluralz: x\n"), "pluralz"),
            (one("    apiVersion: Example/v1\n    template: spec.t\n"), "DNS subdomain"),
            (
                "kinds:\n  - kind: deployment\n    apiVersion: example.com/v1\n    plural: d\n    template: spec.t\n"
                    .into(),
                "capital",
            ),
            (
                "kinds:\n  - kind: Deployment\n    apiVersion: example.com/v1\n    plural: d\n    template: spec.t\n"
                    .into(),
                "taken by apps/v1 Deployment",
            ),
            ("kinds: [[[".into(), "is not a `kinds:` list"),
        ];
        for (text, expected) in cases {
            let error = error_of(&text);
            assert!(error.contains(expected), "{text}\n-> {error}\n(expected {expected:?})");
        }
        let many: String = (0..=MAX_KINDS)
            .map(|n| format!("  - {{kind: K{n}, apiVersion: example.com/v1, plural: k{n}, template: spec.t}}\n"))
            .collect();
        assert!(error_of(&format!("kinds:\n{many}")).contains("at most 32"));
    }

    #[test]
    fn a_declared_kind_is_found_by_its_names_and_declared_once() {
        let rows = parse("kinds.yaml", TWO).expect("two kinds");
        let kinds = declare_for_tests();
        assert_eq!(kinds, vec![WorkloadKind::Custom(0), WorkloadKind::Custom(1)]);
        assert_eq!(declare(&rows).expect("the same again"), kinds);
        assert!(matches!(declare(&rows[..1]), Err(DeclareError::Redeclared)));
        assert_eq!(WorkloadKind::Custom(1).kind(), "VMAgent");
        assert_eq!(WorkloadKind::Custom(1).api_version(), "operator.victoriametrics.com/v1beta1");
        for name in
            ["vmagent", "VMAgents", "vmagents.operator.victoriametrics.com", "vmagent.operator.victoriametrics.com"]
        {
            assert_eq!(WorkloadKind::from_type_name(name), Some(WorkloadKind::Custom(1)), "{name}");
        }
        assert_eq!(WorkloadKind::all().count(), WorkloadKind::ALL.len() + 2);
    }
}
