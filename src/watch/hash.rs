//! Reloader's SHA-1 hash of a resource's data, byte for byte.
//!
//! A workload records this value (`STAKATER_*` env var or `last-reloaded-from`), so any
//! difference from Reloader here would roll every reloaded workload on the image swap.
//! Rule: one `key=value` string per entry, sorted bytewise as whole strings, joined with `;`,
//! SHA-1, 40 lowercase hex characters.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine as _;
use sha1::{Digest, Sha1};

/// A 20-byte SHA-1 digest, shown as Reloader shows it: 40 lowercase hex characters.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DataHash([u8; 20]);

impl DataHash {
    /// Its first 8 bytes as a number (the first 16 hex characters): what a checkpoint keeps,
    /// and what the store keeps of a resource's load-time hash.
    pub fn short(&self) -> u64 {
        let mut head = [0; 8];
        head.copy_from_slice(&self.0[..8]);
        u64::from_be_bytes(head)
    }

    /// The hash of arbitrary bytes (`GenerateSHA` in Reloader).
    pub fn of_bytes(bytes: &[u8]) -> Self {
        DataHash(Sha1::digest(bytes).into())
    }

    /// ConfigMap: `data` entries as `key=value`, `binaryData` entries as `key=base64(value)`.
    pub fn of_configmap(data: &BTreeMap<String, String>, binary_data: &BTreeMap<String, Vec<u8>>) -> Self {
        let base64 = base64::engine::general_purpose::STANDARD;
        let mut entries: Vec<Vec<u8>> = data
            .iter()
            .map(|(k, v)| entry(k.as_bytes(), v.as_bytes()))
            .chain(binary_data.iter().map(|(k, v)| entry(k.as_bytes(), base64.encode(v).as_bytes())))
            .collect();
        Self::of_entries(&mut entries)
    }

    /// Secret: `data` entries as `key=<decoded bytes, verbatim>`.
    pub fn of_secret(data: &BTreeMap<String, Vec<u8>>) -> Self {
        let mut entries: Vec<Vec<u8>> = data.iter().map(|(k, v)| entry(k.as_bytes(), v)).collect();
        Self::of_entries(&mut entries)
    }

    /// SecretProviderClassPodStatus: `id=version` per mounted object plus
    /// `SecretProviderClassName=<class>`; the pod is deliberately not part of it.
    pub fn of_secret_provider_class<'a>(
        class_name: &str,
        objects: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Self {
        let mut entries: Vec<Vec<u8>> = objects
            .into_iter()
            .map(|(id, version)| entry(id.as_bytes(), version.as_bytes()))
            .chain(std::iter::once(entry(b"SecretProviderClassName", class_name.as_bytes())))
            .collect();
        Self::of_entries(&mut entries)
    }

    fn of_entries(entries: &mut [Vec<u8>]) -> Self {
        entries.sort_unstable();
        let mut hasher = Sha1::new();
        for (i, e) in entries.iter().enumerate() {
            if i > 0 {
                hasher.update(b";");
            }
            hasher.update(e);
        }
        DataHash(hasher.finalize().into())
    }

    /// Parse the 40-hex-character form written into workloads. `None` for anything else.
    pub fn parse_hex(text: &str) -> Option<Self> {
        let bytes = text.as_bytes();
        if bytes.len() != 40 {
            return None;
        }
        let mut out = [0u8; 20];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            let hi = (pair[0] as char).to_digit(16)?;
            let lo = (pair[1] as char).to_digit(16)?;
            out[i] = (hi * 16 + lo) as u8;
        }
        Some(DataHash(out))
    }
}

fn entry(key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut e = Vec::with_capacity(key.len() + 1 + value.len());
    e.extend_from_slice(key);
    e.push(b'=');
    e.extend_from_slice(value);
    e
}

impl fmt::Display for DataHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for DataHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DataHash({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn bytes(pairs: &[(&str, &[u8])]) -> BTreeMap<String, Vec<u8>> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_vec())).collect()
    }

    // Vectors from the behaviour reference, section 2.5 (tests/golden/hash-vectors.txt).
    const GOLDEN: &str = include_str!("../../tests/golden/hash-vectors.txt");

    fn golden(name: &str) -> String {
        GOLDEN
            .lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("golden vector {name} missing"))
            .trim()
            .to_string()
    }

    #[test]
    fn the_short_form_is_the_first_sixteen_hex_characters_as_checkpoints_store_them() {
        let hash = DataHash::of_bytes(b"a=1");
        let text = hash.to_string();
        assert_eq!(format!("{:016x}", hash.short()), text[..16]);
        assert_ne!(hash.short(), DataHash::of_bytes(b"a=2").short());
    }

    #[test]
    fn generate_sha_matches_reloader() {
        assert_eq!(DataHash::of_bytes(b"www.stakater.com").to_string(), golden("generate_sha"));
        assert_eq!(DataHash::of_bytes(b"").to_string(), golden("empty"));
    }

    #[test]
    fn empty_configmap_hashes_like_the_empty_string() {
        let h = DataHash::of_configmap(&BTreeMap::new(), &BTreeMap::new());
        assert_eq!(h.to_string(), golden("empty"));
    }

    #[test]
    fn configmap_vectors_match_reloader() {
        let none = BTreeMap::new();
        assert_eq!(DataHash::of_configmap(&strings(&[("test", "test")]), &none).to_string(), golden("cm_test"));
        assert_eq!(DataHash::of_configmap(&strings(&[("b", "2"), ("a", "1")]), &none).to_string(), golden("cm_a1_b2"));
        assert_eq!(
            DataHash::of_configmap(&strings(&[("a", "x"), ("a.b", "y")]), &none).to_string(),
            golden("cm_whole_string_sort")
        );
        assert_eq!(
            DataHash::of_configmap(&strings(&[("test", "test")]), &bytes(&[("bintest", b"test")])).to_string(),
            golden("cm_binary")
        );
    }

    #[test]
    fn binary_data_changes_the_hash() {
        let data = strings(&[("test", "test")]);
        let only_data = DataHash::of_configmap(&data, &BTreeMap::new());
        let both = DataHash::of_configmap(&data, &bytes(&[("bin", b"\x00\x01")]));
        let only_binary = DataHash::of_configmap(&BTreeMap::new(), &bytes(&[("bin", b"\x00\x01")]));
        assert_ne!(only_data, both);
        assert_ne!(both, only_binary);
    }

    #[test]
    fn secret_vectors_match_reloader() {
        let data = bytes(&[("password", b"hunter2"), ("user", b"admin")]);
        assert_eq!(DataHash::of_secret(&data).to_string(), golden("secret"));
    }

    #[test]
    fn secret_hashes_raw_bytes_not_base64() {
        let raw = bytes(&[("k", b"\xff\xfe")]);
        let mut expected = b"k=".to_vec();
        expected.extend_from_slice(b"\xff\xfe");
        assert_eq!(DataHash::of_secret(&raw), DataHash::of_bytes(&expected));
    }

    #[test]
    fn secret_provider_class_vector_matches_reloader() {
        let h = DataHash::of_secret_provider_class("my-spc", [("secret/password", "v1")]);
        assert_eq!(h.to_string(), golden("spcps"));
    }

    #[test]
    fn hex_round_trips_and_rejects_garbage() {
        let h = DataHash::of_bytes(b"x");
        assert_eq!(DataHash::parse_hex(&h.to_string()), Some(h));
        assert_eq!(DataHash::parse_hex("xyz"), None);
        assert_eq!(DataHash::parse_hex(&"g".repeat(40)), None);
    }
}
