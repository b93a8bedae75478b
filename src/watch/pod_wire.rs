//! A pod template as the API server sends it, only the parts that name a ConfigMap, Secret or
//! SecretProviderClass or record a reload: what the compactor and the used-keys reading share.

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Clone, Debug, Default, Deserialize)]
pub struct WirePodTemplate {
    #[serde(default)]
    pub metadata: WireTemplateMeta,
    #[serde(default)]
    pub spec: WirePodSpec,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct WireTemplateMeta {
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WirePodSpec {
    #[serde(default)]
    pub containers: Vec<WireContainer>,
    #[serde(default)]
    pub init_containers: Vec<WireContainer>,
    #[serde(default)]
    pub volumes: Vec<WireVolume>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireContainer {
    pub name: String,
    #[serde(default)]
    pub env: Vec<WireEnvVar>,
    #[serde(default)]
    pub env_from: Vec<WireEnvFrom>,
    #[serde(default)]
    pub volume_mounts: Vec<WireMount>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireMount {
    pub name: String,
    /// One file of the volume (a key of a ConfigMap or Secret volume without items).
    pub sub_path: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireEnvVar {
    pub name: String,
    pub value: Option<String>,
    pub value_from: Option<WireEnvSource>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireEnvSource {
    pub config_map_key_ref: Option<OptionalNamed>,
    pub secret_key_ref: Option<OptionalNamed>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireEnvFrom {
    pub config_map_ref: Option<OptionalNamed>,
    pub secret_ref: Option<OptionalNamed>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireVolume {
    pub name: String,
    pub config_map: Option<OptionalNamed>,
    pub secret: Option<WireSecretVolume>,
    pub projected: Option<WireProjected>,
    pub csi: Option<WireCsi>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireSecretVolume {
    pub secret_name: Option<String>,
    #[serde(default)]
    pub items: Vec<WireKeyToPath>,
}

/// A volume item: which key of the ConfigMap or Secret is projected.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct WireKeyToPath {
    pub key: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct WireProjected {
    #[serde(default)]
    pub sources: Vec<WireProjection>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireProjection {
    pub config_map: Option<OptionalNamed>,
    pub secret: Option<OptionalNamed>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireCsi {
    #[serde(default)]
    pub volume_attributes: BTreeMap<String, String>,
}

/// A reference by name; a key reference (`configMapKeyRef`) also names its key, a volume
/// source its items.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct OptionalNamed {
    pub name: Option<String>,
    pub key: Option<String>,
    #[serde(default)]
    pub items: Vec<WireKeyToPath>,
}
