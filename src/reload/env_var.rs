//! The `STAKATER_<NAME>_<TYPE>` env var name written by the env-vars strategy.

use crate::watch::ResourceKind;

/// Reloader's env var name for a resource: `STAKATER_` + converted name + `_` + type.
pub fn env_var_name(resource_name: &str, kind: ResourceKind) -> String {
    format!("STAKATER_{}_{}", convert_to_env_var_name(resource_name), kind.type_suffix())
}

/// Upper-case, then walk bytes: keep `A-Z0-9`; any run of other bytes becomes one `_`, but only
/// after a kept byte (leading runs vanish, a trailing run leaves a trailing `_`). Byte-for-byte
/// what Reloader does, collisions included.
fn convert_to_env_var_name(text: &str) -> String {
    let upper = text.to_ascii_uppercase();
    let mut out = String::with_capacity(upper.len());
    let mut last_was_kept = false;
    for b in upper.bytes() {
        if b.is_ascii_uppercase() || b.is_ascii_digit() {
            out.push(b as char);
            last_was_kept = true;
        } else if last_was_kept {
            out.push('_');
            last_was_kept = false;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_reloader_examples() {
        assert_eq!(env_var_name("my-config", ResourceKind::ConfigMap), "STAKATER_MY_CONFIG_CONFIGMAP");
        assert_eq!(env_var_name("my.app.config", ResourceKind::ConfigMap), "STAKATER_MY_APP_CONFIG_CONFIGMAP");
        assert_eq!(env_var_name("db-creds", ResourceKind::Secret), "STAKATER_DB_CREDS_SECRET");
        assert_eq!(
            env_var_name("vault-spc", ResourceKind::SecretProviderClass),
            "STAKATER_VAULT_SPC_SECRETPROVIDERCLASS"
        );
        assert_eq!(convert_to_env_var_name("www.stakater.com"), "WWW_STAKATER_COM");
    }

    #[test]
    fn runs_collapse_leading_runs_vanish_trailing_run_stays() {
        assert_eq!(convert_to_env_var_name("--a..b--"), "A_B_");
        assert_eq!(convert_to_env_var_name("a-b.c"), convert_to_env_var_name("a.b-c"));
        assert_eq!(convert_to_env_var_name("..."), "");
    }
}
