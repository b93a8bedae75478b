//! Reloader's SHA-1 hash of a resource's data, byte for byte.
//!
//! A workload records this value (`STAKATER_*` env var or `last-reloaded-from`), so any
//! difference from Reloader here would roll every reloaded workload on the image swap.
//! Rule: one `key=value` string per entry, sorted bytewise as whole strings, joined with `;`,
//! SHA-1, 40 lowercase hex characters.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine as _;
use sha1::Sha1;
use sha1::digest::{self, Digest};
use sha2::Sha512_256;

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
        DataHash(joined::<Sha1>(&mut configmap_entries(data, binary_data)).into())
    }

    /// Secret: `data` entries as `key=<decoded bytes, verbatim>`.
    pub fn of_secret(data: &BTreeMap<String, Vec<u8>>) -> Self {
        DataHash(joined::<Sha1>(&mut secret_entries(data)).into())
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
        DataHash(joined::<Sha1>(entries).into())
    }

    /// Parse the 40-hex-character form written into workloads. `None` for anything else.
    #[cfg(test)]
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

/// `--hash=sha512-256`: SHA-512/256 of the same input as [`DataHash`] (Reloader's open PR
/// #1086), 64 lowercase hex characters. Written instead of the SHA-1 once chosen; either form
/// recorded for the current data counts as up to date.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct WideHash([u8; 32]);

impl WideHash {
    pub fn of_configmap(data: &BTreeMap<String, String>, binary_data: &BTreeMap<String, Vec<u8>>) -> Self {
        WideHash(joined::<Sha512_256>(&mut configmap_entries(data, binary_data)).into())
    }

    pub fn of_secret(data: &BTreeMap<String, Vec<u8>>) -> Self {
        WideHash(joined::<Sha512_256>(&mut secret_entries(data)).into())
    }
}

/// `--hash`: the form a reload write records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HashForm {
    /// Reloader's SHA-1 (40 hex digits).
    #[default]
    Sha1,
    /// SHA-512/256 of the same input (64 hex digits), for ConfigMaps and Secrets.
    Sha512_256,
}

impl std::str::FromStr for HashForm {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "sha1" => Ok(HashForm::Sha1),
            "sha512-256" => Ok(HashForm::Sha512_256),
            other => Err(format!("{other:?} is not a hash: expected sha1 or sha512-256")),
        }
    }
}

/// The forms of one resource's hash a workload may record: Reloader's SHA-1, and with
/// `--hash=sha512-256` the wide one, which is then what a write records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hashes {
    pub sha1: DataHash,
    pub wide: Option<WideHash>,
}

impl Hashes {
    /// What a write records.
    pub fn written(&self) -> String {
        match self.wide {
            Some(wide) => wide.to_string(),
            None => self.sha1.to_string(),
        }
    }

    /// Whether a recorded value is this data's, in either form.
    pub fn is_recorded_as(&self, text: &str) -> bool {
        match text.len() {
            40 => self.sha1.to_string() == text,
            64 => self.wide.is_some_and(|w| w.to_string() == text),
            _ => false,
        }
    }
}

impl From<DataHash> for Hashes {
    fn from(sha1: DataHash) -> Self {
        Hashes { sha1, wide: None }
    }
}

fn configmap_entries(data: &BTreeMap<String, String>, binary_data: &BTreeMap<String, Vec<u8>>) -> Vec<Vec<u8>> {
    let base64 = base64::engine::general_purpose::STANDARD;
    data.iter()
        .map(|(k, v)| entry(k.as_bytes(), v.as_bytes()))
        .chain(binary_data.iter().map(|(k, v)| entry(k.as_bytes(), base64.encode(v).as_bytes())))
        .collect()
}

fn secret_entries(data: &BTreeMap<String, Vec<u8>>) -> Vec<Vec<u8>> {
    data.iter().map(|(k, v)| entry(k.as_bytes(), v)).collect()
}

/// The entries sorted bytewise as whole strings, joined with `;`, digested.
fn joined<D: Digest>(entries: &mut [Vec<u8>]) -> digest::Output<D> {
    entries.sort_unstable();
    let mut hasher = D::new();
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            hasher.update(b";");
        }
        hasher.update(e);
    }
    hasher.finalize()
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

impl fmt::Display for WideHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for WideHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WideHash({self})")
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
    fn the_wide_hash_is_sha512_256_of_reloaders_input() {
        // `printf 'test=test' | openssl dgst -sha512-256`: the input of the cm_test vector.
        let wide = WideHash::of_configmap(&strings(&[("test", "test")]), &BTreeMap::new());
        assert_eq!(wide.to_string(), "42444f71dad85c450e773a3265284692b240aa22b00d0f8513a5d23814a191cc");
        let secret = bytes(&[("password", b"hunter2"), ("user", b"admin")]);
        assert_eq!(
            WideHash::of_secret(&secret).to_string(),
            "9553d80273b68bf2a06b5f716dded65b049f5b6ae2446c09e5f7c4febe504da9"
        );
    }

    #[test]
    fn hex_round_trips_and_rejects_garbage() {
        let h = DataHash::of_bytes(b"x");
        assert_eq!(DataHash::parse_hex(&h.to_string()), Some(h));
        assert_eq!(DataHash::parse_hex("xyz"), None);
        assert_eq!(DataHash::parse_hex(&"g".repeat(40)), None);
    }
}
