//! Alerts after reloads (Slack, Teams, Google Chat, any webhook), as Reloader sends them, and
//! the sender that delivers them without ever holding up a reload.
//!
//! ```text
//!  engine ──try_send──▶ bounded queue ──▶ sender task ──POST (timeout, retries)──▶ sink
//!            full: dropped and counted          failed after retries: logged and counted
//! ```
//! Payloads are pure functions of the reload ([`payload`]); only the sender does I/O.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::reload::Metrics;
use crate::reload::api::causes;
use crate::watch::{ResourceKey, WorkloadKey};

/// Alerts waiting to be sent at most; beyond that a new one is dropped (and counted).
pub const ALERT_QUEUE: usize = 1024;
/// One request's time limit, as Reloader's client.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts per alert: the first and two retries (Reloader v1 tries once).
const ATTEMPTS: u32 = 3;
const RETRY_BASE: Duration = Duration::from_millis(500);

/// Where alerts go (`ALERT_SINK`): anything but slack, teams and gchat is a raw webhook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sink {
    Slack,
    Teams,
    GChat,
    Raw,
}

impl FromStr for Sink {
    type Err = std::convert::Infallible;
    /// Reloader's rule: lower-cased and trimmed; unknown values (`webhook`, `raw`, empty) are raw.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "slack" => Sink::Slack,
            "teams" => Sink::Teams,
            "gchat" => Sink::GChat,
            _ => Sink::Raw,
        })
    }
}

impl fmt::Display for Sink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Sink::Slack => "slack",
            Sink::Teams => "teams",
            Sink::GChat => "gchat",
            Sink::Raw => "raw",
        })
    }
}

/// How alerts are sent.
#[derive(Clone, Debug)]
pub struct AlertConfig {
    pub sink: Sink,
    pub url: reqwest::Url,
    /// `ALERT_ADDITIONAL_INFO`: put in front of every message.
    pub additional_info: String,
    /// `--alert-structured`: Reloader v2's formats (cards, structured JSON) instead of v1's.
    pub structured: bool,
}

/// One successful reload, as an alert tells it.
#[derive(Clone, Debug)]
pub struct Alert {
    pub resource: ResourceKey,
    pub workload: WorkloadKey,
    pub at: jiff::Timestamp,
}

/// The request body and its content type for `alert` under `config`.
pub fn payload(config: &AlertConfig, alert: &Alert) -> (&'static str, Vec<u8>) {
    let info = config.additional_info.as_str();
    if !config.structured {
        // Reloader v1.
        let mut text = format!(
            "Reloader detected changes in *{}* of type *{}* in namespace *{}*. Hence reloaded *{}* of type *{}* in namespace *{}*",
            alert.resource.name,
            alert.resource.kind.type_suffix(),
            alert.resource.namespace,
            alert.workload.name,
            alert.workload.kind.kind(),
            alert.workload.namespace
        );
        if !info.is_empty() {
            text = format!("{info} : {text}");
        }
        return match config.sink {
            Sink::Slack => json(&SlackMessage {
                attachments: vec![SlackAttachment { color: "good", author_name: "Reloader", text }],
            }),
            Sink::Teams | Sink::GChat => json(&TextMessage { text }),
            Sink::Raw => ("text/plain", text.replace('*', "").into_bytes()),
        };
    }
    // Reloader v2 (`--alert-structured`).
    let workload = format!("{}/{} ({})", alert.workload.namespace, alert.workload.name, alert.workload.kind.kind());
    let resource = format!("{}/{} ({})", alert.resource.namespace, alert.resource.name, alert.resource.kind.kind());
    let time = alert.at.strftime("%Y-%m-%d %H:%M:%S UTC").to_string();
    let title = "Reloader triggered reload";
    match config.sink {
        Sink::Slack => {
            let mut text = format!("{title}\n*Workload:* {workload}\n*Resource:* {resource}\n*Time:* {time}");
            if !info.is_empty() {
                text = format!("{info}\n{text}");
            }
            json(&SlackMessage { attachments: vec![SlackAttachment { color: "good", author_name: "Reloader", text }] })
        }
        Sink::Teams => json(&TeamsCard {
            type_: "MessageCard",
            context: "http://schema.org/extensions",
            theme_color: "0076D7",
            summary: title,
            sections: vec![TeamsSection {
                activity_title: title,
                activity_subtitle: info.to_string(),
                facts: vec![
                    TeamsFact { name: "Workload", value: workload },
                    TeamsFact { name: "Resource", value: resource },
                    TeamsFact { name: "Time", value: time },
                ],
            }],
        }),
        Sink::GChat => json(&GChatMessage {
            cards: vec![GChatCard {
                header: GChatHeader { title, subtitle: info.to_string() },
                sections: vec![GChatSection {
                    widgets: vec![
                        GChatWidget { key_value: GChatKeyValue { top_label: "Workload", content: workload } },
                        GChatWidget { key_value: GChatKeyValue { top_label: "Resource", content: resource } },
                        GChatWidget { key_value: GChatKeyValue { top_label: "Time", content: time } },
                    ],
                }],
            }],
        }),
        Sink::Raw => json(&RawEvent {
            event: "reload",
            workload_kind: alert.workload.kind.kind(),
            workload_name: alert.workload.name.to_string(),
            workload_namespace: alert.workload.namespace.to_string(),
            resource_kind: alert.resource.kind.kind(),
            resource_name: alert.resource.name.to_string(),
            resource_namespace: alert.resource.namespace.to_string(),
            timestamp: alert.at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            additional: info.to_string(),
        }),
    }
}

/// Whether a sink took the request: Reloader v1 wants 200 exactly from Teams and Google Chat
/// and anything below 400 from Slack and raw webhooks; v2 wants any 2xx.
fn accepted(config: &AlertConfig, status: reqwest::StatusCode) -> bool {
    match (config.structured, config.sink) {
        (true, _) => status.is_success(),
        (false, Sink::Teams | Sink::GChat) => status == reqwest::StatusCode::OK,
        (false, Sink::Slack | Sink::Raw) => status.as_u16() < 400,
    }
}

/// Send alerts from `queue` until it closes or `shutdown`; each alert is tried up to three
/// times (on connection errors and 5xx), then logged and counted as failed.
pub async fn run_sender(
    client: reqwest::Client,
    config: AlertConfig,
    mut queue: mpsc::Receiver<Alert>,
    metrics: Metrics,
    shutdown: CancellationToken,
) {
    let sink = config.sink.to_string();
    loop {
        let alert = tokio::select! {
            () = shutdown.cancelled() => return,
            alert = queue.recv() => match alert { Some(a) => a, None => return },
        };
        let (content_type, body) = payload(&config, &alert);
        let result = post(&client, &config.url, content_type, body, |status| accepted(&config, status)).await;
        let outcome = match &result {
            Ok(()) => "sent",
            Err(_) => "failed",
        };
        metrics.alerts.with_label_values(&[sink.as_str(), outcome]).inc();
        match result {
            Ok(()) => debug!(workload = %alert.workload, sink = %sink, "alert sent"),
            Err(err) => {
                warn!(workload = %alert.workload, sink = %sink, error = %err, "sending an alert failed; dropping it")
            }
        }
    }
}

/// Why a POST to an alert sink or a webhook failed.
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    /// An answer neither accepted nor a server error: not retried.
    #[error("status {0}")]
    Refused(reqwest::StatusCode),
    #[error("status {0} (after {ATTEMPTS} attempts)")]
    ServerError(reqwest::StatusCode),
    /// The origin only: a Slack or Teams webhook URL carries its token in the path.
    #[error("request to {origin} failed: {cause} (after {ATTEMPTS} attempts)")]
    Unreachable { origin: String, cause: String },
}

/// POST `body`, retrying connection errors and 5xx answers with a jittered backoff; `accepted`
/// judges the final status. The error says what the last attempt got.
///
/// # Errors
/// The last attempt's answer or failure, see [`PostError`].
pub async fn post(
    client: &reqwest::Client,
    url: &reqwest::Url,
    content_type: &str,
    body: Vec<u8>,
    accepted: impl Fn(reqwest::StatusCode) -> bool,
) -> Result<(), PostError> {
    let attempt = || async {
        let request = client
            .post(url.clone())
            .timeout(REQUEST_TIMEOUT)
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .body(body.clone());
        match request.send().await {
            Ok(response) if accepted(response.status()) => Ok(()),
            Ok(response) if response.status().is_server_error() => Err(PostError::ServerError(response.status())),
            Ok(response) => Err(PostError::Refused(response.status())),
            Err(err) => Err(PostError::Unreachable {
                origin: url.origin().ascii_serialization(),
                cause: causes(&err.without_url()),
            }),
        }
    };
    let backoff =
        ExponentialBuilder::new().with_min_delay(RETRY_BASE).with_jitter().with_max_times(ATTEMPTS as usize - 1);
    attempt.retry(backoff).sleep(tokio::time::sleep).when(|e| !matches!(e, PostError::Refused(_))).await
}

/// An HTTP client for alerts and webhooks: no redirects (as Reloader), an optional proxy.
///
/// # Errors
/// A proxy URL the client cannot use, or a TLS set-up failure.
pub fn http_client(proxy: Option<&reqwest::Url>) -> Result<reqwest::Client, reqwest::Error> {
    let mut builder = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).no_proxy();
    if let Some(proxy) = proxy {
        builder = builder.proxy(reqwest::Proxy::all(proxy.clone())?);
    }
    builder.build()
}

/// A payload as JSON; payloads are strings and lists, which cannot fail to serialize.
fn json(value: &impl Serialize) -> (&'static str, Vec<u8>) {
    ("application/json", serde_json::to_vec(value).unwrap_or_default())
}

// The payload shapes. Field order is the wire order Reloader's Go structs give.

#[derive(Serialize)]
struct SlackMessage {
    attachments: Vec<SlackAttachment>,
}

#[derive(Serialize)]
struct SlackAttachment {
    color: &'static str,
    author_name: &'static str,
    text: String,
}

#[derive(Serialize)]
struct TextMessage {
    text: String,
}

#[derive(Serialize)]
struct TeamsCard {
    #[serde(rename = "@type")]
    type_: &'static str,
    #[serde(rename = "@context")]
    context: &'static str,
    #[serde(rename = "themeColor")]
    theme_color: &'static str,
    summary: &'static str,
    sections: Vec<TeamsSection>,
}

#[derive(Serialize)]
struct TeamsSection {
    #[serde(rename = "activityTitle")]
    activity_title: &'static str,
    #[serde(rename = "activitySubtitle", skip_serializing_if = "String::is_empty")]
    activity_subtitle: String,
    facts: Vec<TeamsFact>,
}

#[derive(Serialize)]
struct TeamsFact {
    name: &'static str,
    value: String,
}

#[derive(Serialize)]
struct GChatMessage {
    cards: Vec<GChatCard>,
}

#[derive(Serialize)]
struct GChatCard {
    header: GChatHeader,
    sections: Vec<GChatSection>,
}

#[derive(Serialize)]
struct GChatHeader {
    title: &'static str,
    #[serde(skip_serializing_if = "String::is_empty")]
    subtitle: String,
}

#[derive(Serialize)]
struct GChatSection {
    widgets: Vec<GChatWidget>,
}

#[derive(Serialize)]
struct GChatWidget {
    #[serde(rename = "keyValue")]
    key_value: GChatKeyValue,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GChatKeyValue {
    top_label: &'static str,
    content: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RawEvent {
    event: &'static str,
    workload_kind: &'static str,
    workload_name: String,
    workload_namespace: String,
    resource_kind: &'static str,
    resource_name: String,
    resource_namespace: String,
    timestamp: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    additional: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::{ResourceKind, WorkloadKind};

    fn alert() -> Alert {
        Alert {
            resource: ResourceKey {
                kind: ResourceKind::ConfigMap,
                namespace: "team-a".into(),
                name: "app-config".into(),
            },
            workload: WorkloadKey { kind: WorkloadKind::Deployment, namespace: "team-a".into(), name: "web".into() },
            at: "2026-12-01T10:00:00Z".parse().expect("a timestamp"),
        }
    }

    fn config(sink: Sink, structured: bool, info: &str) -> AlertConfig {
        AlertConfig {
            sink,
            url: "http://127.0.0.1:1/hook".parse().expect("a URL"),
            additional_info: info.into(),
            structured,
        }
    }

    fn body(sink: Sink, structured: bool, info: &str) -> (String, String) {
        let (content_type, bytes) = payload(&config(sink, structured, info), &alert());
        (content_type.to_string(), String::from_utf8(bytes).expect("UTF-8"))
    }

    const V1: &str = "Reloader detected changes in *app-config* of type *CONFIGMAP* in namespace *team-a*. Hence reloaded *web* of type *Deployment* in namespace *team-a*";

    #[test]
    fn v1_payloads_are_reloaders_byte_for_byte() {
        assert_eq!(
            body(Sink::Slack, false, "").1,
            format!(r#"{{"attachments":[{{"color":"good","author_name":"Reloader","text":"{V1}"}}]}}"#)
        );
        assert_eq!(body(Sink::Teams, false, "").1, format!(r#"{{"text":"{V1}"}}"#));
        assert_eq!(body(Sink::GChat, false, "prod").1, format!(r#"{{"text":"prod : {V1}"}}"#));
        let (content_type, raw) = body(Sink::Raw, false, "prod");
        assert_eq!(content_type, "text/plain");
        assert_eq!(raw, format!("prod : {}", V1.replace('*', "")));
    }

    #[test]
    fn structured_payloads_are_reloader_v2s() {
        let raw = body(Sink::Raw, true, "prod").1;
        assert_eq!(
            raw,
            r#"{"event":"reload","workloadKind":"Deployment","workloadName":"web","workloadNamespace":"team-a","resourceKind":"ConfigMap","resourceName":"app-config","resourceNamespace":"team-a","timestamp":"2026-12-01T10:00:00Z","additional":"prod"}"#
        );
        let slack = body(Sink::Slack, true, "").1;
        assert!(slack.contains(r#"Reloader triggered reload\n*Workload:* team-a/web (Deployment)\n*Resource:* team-a/app-config (ConfigMap)\n*Time:* 2026-12-01 10:00:00 UTC"#), "{slack}");
        let teams = body(Sink::Teams, true, "").1;
        assert!(
            teams.starts_with(
                r#"{"@type":"MessageCard","@context":"http://schema.org/extensions","themeColor":"0076D7""#
            ),
            "{teams}"
        );
        let gchat = body(Sink::GChat, true, "prod").1;
        assert!(gchat.contains(r#""header":{"title":"Reloader triggered reload","subtitle":"prod"}"#), "{gchat}");
        assert!(
            gchat.contains(r#"{"keyValue":{"topLabel":"Workload","content":"team-a/web (Deployment)"}}"#),
            "{gchat}"
        );
    }

    #[test]
    fn sinks_parse_like_reloader() {
        assert_eq!(" Slack ".parse(), Ok(Sink::Slack));
        assert_eq!("webhook".parse(), Ok(Sink::Raw));
        assert_eq!("".parse(), Ok(Sink::Raw));
    }
}
