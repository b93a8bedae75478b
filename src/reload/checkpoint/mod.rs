//! The checkpoint: the hash last acted on for every resource of a shard, kept in ConfigMaps so
//! that a change made while no replica watched is still acted on (DESIGN principle 2).
//!
//! # Guarantees
//! - An entry is written only after every workload the change concerns records the hash, so
//!   a checkpoint can lag behind the workloads but never run ahead of them.
//! - A lagging checkpoint is harmless: replaying a change finds the hash already recorded on
//!   each workload and writes nothing. Every way a read can go stale below (a part of an older
//!   layout, a journal older than a part) only ever lags.
//! - A resource the checkpoint cannot vouch for (its part is missing or unreadable) is not
//!   "created": [`Loaded::knows`] says so, and the engine takes it as a baseline.
//!
//! # Format (version 2)
//! ```text
//!  <name>  (the head)                          <name>-part-<i>   (i < parts; only when parts > 0)
//!  data.format  = "2"                          data.layout = "<i>/<parts>"
//!  data.parts   = "0" (base inline) or 2^k     binaryData.entries = zlib text of the resources
//!  data.entries = how many resources                                whose part is i
//!  binaryData.base    = zlib text (inline)
//!  binaryData.journal = zlib text: what differs from the base (entries and removals)
//!  annotation reloader-fleet.stakater.com/saved-at = RFC 3339 time of the last save
//! ```
//! A save writes the head alone, its journal holding what changed since the base was written,
//! until the journal outgrows [`JOURNAL_MAX`] (or half the base): then the base is rewritten
//! (the parts whose text changed, then the head with an empty journal). A shard of 1,000,000
//! resources with real names takes about 18 MiB in 32-64 parts, and a save during 100
//! changes a second sends the head, not the parts (figures in `docs/fleet.md`, "Sizing").
//! Parts are written before the head, in an order that leaves every resource readable from
//! either the old or the new layout at every step (see [`Checkpoint::write_parts`]).
//! Version 1 (one text key, `checkpoint`) is read, so an upgrade loses nothing; a format this
//! version does not know is refused with an error and counted, and the shard starts from a
//! baseline, as with no checkpoint.
//!
//! # Trust
//! The ConfigMaps are read as untrusted input: one without this controller's labels (someone
//! else's ConfigMap of that name) is not used, a line that is not an entry of a valid name and
//! hash is skipped, a compressed text that unpacks past [`format::MAX_TEXT`] is refused, and
//! each is logged and counted (`reloader_errors_total{type="checkpoint_rejected"}`). What
//! cannot be checked is who wrote it: anyone who may write ConfigMaps in the controller's
//! namespace can make it skip or replay changes, so that namespace is the controller's own
//! (docs/security.md).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::{Api, Client};
use tracing::{error, warn};

use crate::reload::api::timed;
use crate::watch::{DataHash, INTERNAL_LABEL, ResourceKey, ResourceMap};

mod format;

pub use format::parse_v1 as parse;

/// The short form of a hash kept in the checkpoint: 64 bits are plenty to tell "changed" from
/// "unchanged".
pub type ShortHash = u64;

pub fn short(hash: &DataHash) -> ShortHash {
    hash.short()
}

/// The format this version writes; a head of a higher one is refused.
const FORMAT: u32 = 2;
/// The most parts a shard's checkpoint is split into: about 30 MiB of compressed entries, 1.5
/// million resources with real names. Part names are `<name>-part-0` to `-part-31`, so the
/// chart's RBAC can name each.
pub const MAX_PARTS: u32 = 32;
/// The size a part is cut for: room to grow before a part reaches [`MAX_OBJECT`].
const PART_TARGET: usize = 512 << 10;
/// The most compressed bytes one object holds: ConfigMaps are limited to 1 MiB of data.
const MAX_OBJECT: usize = 960 << 10;
/// Up to this size the base stays in the head: one object per shard, as most shards are.
const INLINE_MAX: usize = 128 << 10;
/// The most compressed bytes the journal grows to before the base is rewritten.
const JOURNAL_MAX: usize = 256 << 10;
/// Parts read at once when a shard is taken up.
const PARTS_AT_ONCE: usize = 4;

const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "reloader-fleet");
/// When the checkpoint was last saved (written by the replica, read by `fleet status`).
pub const SAVED_AT_ANNOTATION: &str = "reloader-fleet.stakater.com/saved-at";
const KEY_FORMAT: &str = "format";
const KEY_PARTS: &str = "parts";
const KEY_ENTRIES: &str = "entries";
const KEY_BASE: &str = "base";
const KEY_JOURNAL: &str = "journal";
const KEY_LAYOUT: &str = "layout";
/// The single text key of version 1.
const KEY_V1: &str = "checkpoint";

/// One shard's acted-on hashes, as the engine keeps them.
pub type ShardMap = ResourceMap<ShortHash>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused the call. A 5xx or 429 passes; a 413 or etcd's "request is too
    /// large" does not (the checkpoint is split so that it never should); a 403 needs RBAC.
    #[error("checkpoint {namespace}/{name}: the API server answered {code}: {message}")]
    Refused { namespace: String, name: String, code: u16, message: String },
    /// The call did not reach the API server or timed out; retrying may help.
    #[error("checkpoint {namespace}/{name}: API call failed")]
    Unreachable {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    /// The shard holds more resources than [`MAX_PARTS`] parts can: more `--shards` split it.
    #[error(
        "checkpoint {namespace}/{name}: {entries} resources do not fit in {MAX_PARTS} ConfigMaps of 1 MiB; raise --shards"
    )]
    TooLarge { namespace: String, name: String, entries: usize },
}

impl Error {
    fn of(namespace: &str, name: &str, source: kube::Error) -> Self {
        let (namespace, name) = (namespace.to_string(), name.to_string());
        match source {
            kube::Error::Api(status) => Error::Refused { namespace, name, code: status.code, message: status.message },
            source => Error::Unreachable { namespace, name, source },
        }
    }

    fn code(&self) -> Option<u16> {
        match self {
            Error::Refused { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// What a read of a checkpoint found.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The hash acted on per resource.
    pub entries: HashMap<ResourceKey, ShortHash>,
    /// What the checkpoint can vouch for: `None` all of the shard; else per layout (part
    /// count) the parts read whole, and the resources the journal names.
    coverage: Option<Coverage>,
}

#[derive(Debug, Default)]
struct Coverage {
    parts: BTreeMap<u32, BTreeSet<u32>>,
    journaled: HashSet<ResourceKey>,
}

impl Loaded {
    /// Whether the checkpoint vouches for every resource of the shard.
    pub fn is_whole(&self) -> bool {
        self.coverage.is_none()
    }

    /// Whether the checkpoint vouches for `key`: a resource it knows and does not list was
    /// created since (or deleted before) its save; one it cannot know about (its part was
    /// not read) is neither.
    pub fn knows(&self, key: &ResourceKey) -> bool {
        let Some(coverage) = &self.coverage else { return true };
        coverage.journaled.contains(key)
            || coverage.parts.iter().any(|(&parts, read)| read.contains(&format::part_of(key, parts)))
    }
}

/// What one save sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Saved {
    /// Request bytes sent (the objects as JSON, about).
    pub bytes: usize,
    /// Objects written.
    pub objects: usize,
    /// Compressed bytes the checkpoint now takes in the cluster.
    pub stored: usize,
}

/// What the cluster holds, as far as this replica knows: the base the journal is relative to.
#[derive(Clone, Debug)]
struct Written {
    base: Arc<ShardMap>,
    /// 0: the base is in the head (`inline`); else the part count.
    parts: u32,
    /// The compressed base when inline.
    inline: Arc<Vec<u8>>,
    /// Per part, the digest of its text (0: unknown, written again at the next rewrite).
    digests: Vec<u64>,
    /// Compressed bytes of the base.
    base_bytes: usize,
    /// Digest of the journal text last written, and its compressed size.
    journal: (u64, usize),
}

/// Where a checkpoint lives and how to read and write it.
#[derive(Clone)]
pub struct Checkpoint {
    api: Api<ConfigMap>,
    namespace: String,
    name: String,
    /// The head's resourceVersion last read or written, for the write precondition.
    head_version: Option<String>,
    /// Each part's resourceVersion last read or written (`None`: not known to exist).
    part_versions: Vec<Option<String>>,
    /// Parts that may hold a layout given up (a shrink), to delete.
    stale_parts: BTreeSet<u32>,
    written: Option<Written>,
    /// Why the last load used none or part of what it read, for the engine to count.
    rejected: Option<&'static str>,
}

impl Checkpoint {
    pub fn new(client: Client, namespace: &str, name: &str) -> Self {
        Checkpoint {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            name: name.to_string(),
            head_version: None,
            part_versions: vec![None; MAX_PARTS as usize],
            stale_parts: BTreeSet::new(),
            written: None,
            rejected: None,
        }
    }

    /// The name of the checkpoint of `shard` of `shards`, from `--checkpoint-name`: the name
    /// itself with one shard, `<name>-shard-<n>` with more.
    pub fn name_of(base: &str, shard: u32, shards: u32) -> String {
        if shards <= 1 { base.to_string() } else { format!("{base}-shard-{shard}") }
    }

    /// The name of part `i` of the checkpoint called `head`.
    pub fn part_name(head: &str, i: u32) -> String {
        format!("{head}-part-{i}")
    }

    /// Why the last [`load`](Self::load) used none or part of what it read, if it did.
    pub fn rejected(&self) -> Option<&'static str> {
        self.rejected
    }

    fn error(&self, name: &str, source: kube::Error) -> Error {
        Error::of(&self.namespace, name, source)
    }

    async fn get(&self, name: &str) -> Result<Option<ConfigMap>, Error> {
        timed(self.api.get_opt(name)).await.map_err(|e| self.error(name, e))
    }

    /// Load the checkpoint; `None` when there is none to use (a first start, or one that
    /// cannot be used: then the current state is the baseline).
    ///
    /// # Errors
    /// When an object cannot be read.
    pub async fn load(&mut self) -> Result<Option<Loaded>, Error> {
        self.written = None;
        self.rejected = None;
        let Some(head) = self.get(&self.name.clone()).await? else {
            self.head_version = None;
            return Ok(None);
        };
        self.head_version = head.metadata.resource_version.clone();
        if !is_ours(&head) {
            // Not ours (a ConfigMap of the same name, made by someone else): not trusted, and
            // replaced by the next save.
            error!(namespace = %self.namespace, name = %self.name,
                "the checkpoint ConfigMap was not written by reloader-fleet (it lacks the managed-by label); \
                 ignoring it and taking the current state as baseline");
            return Ok(self.reject("foreign"));
        }
        let data = head.data.unwrap_or_default();
        let binary = head.binary_data.unwrap_or_default();
        match data.get(KEY_FORMAT).map(String::as_str) {
            None => Ok(self.load_v1(data.get(KEY_V1).map(String::as_str).unwrap_or(""))),
            Some("2") => self.load_v2(&data, &binary).await,
            Some(other) => {
                error!(namespace = %self.namespace, name = %self.name, format = other, supported = FORMAT,
                    "the checkpoint was written by a newer version of reloader-fleet in a format this one cannot \
                     read; taking the current state as baseline (changes made while no replica ran are not acted on)");
                Ok(self.reject("newer_format"))
            }
        }
    }

    fn reject(&mut self, why: &'static str) -> Option<Loaded> {
        self.rejected = Some(why);
        None
    }

    fn load_v1(&mut self, text: &str) -> Option<Loaded> {
        let (entries, unreadable) = parse(text);
        self.counted_unreadable(unreadable, entries.len())?;
        // No base known: the first save rewrites it in version 2.
        Some(Loaded { entries, coverage: None })
    }

    /// `None` (and rejected) when nothing readable came of `unreadable` lines; warns when
    /// some lines were skipped.
    fn counted_unreadable(&mut self, unreadable: usize, readable: usize) -> Option<()> {
        if unreadable > 0 && readable == 0 {
            // Nothing usable (edited by hand, or written by something else): taken like a first
            // start, so the current state is the baseline. Treating every resource as new
            // would reload all their workloads with --reload-on-create.
            warn!(namespace = %self.namespace, name = %self.name, unreadable,
                "the checkpoint is unreadable; taking the current state as baseline");
            return self.reject("unreadable").map(|_| ());
        }
        if unreadable > 0 {
            warn!(namespace = %self.namespace, name = %self.name, unreadable, "skipping unreadable checkpoint lines");
            self.rejected = Some("unreadable");
        }
        Some(())
    }

    async fn load_v2(
        &mut self,
        data: &BTreeMap<String, String>,
        binary: &BTreeMap<String, ByteString>,
    ) -> Result<Option<Loaded>, Error> {
        let Some(parts) = data.get(KEY_PARTS).and_then(|p| p.parse::<u32>().ok()).filter(|&p| is_layout(p)) else {
            warn!(namespace = %self.namespace, name = %self.name, "the checkpoint names no valid part count");
            return Ok(self.reject("unreadable"));
        };
        let mut unreadable = 0;
        let mut text_of = |key: &str| -> Option<String> {
            let text = format::decompress(&binary.get(key)?.0);
            unreadable += usize::from(text.is_none());
            text
        };
        let journal_text = text_of(KEY_JOURNAL).unwrap_or_default();
        let inline = (parts == 0).then(|| binary.get(KEY_BASE).map(|b| b.0.clone()).unwrap_or_default());
        let base_text = if parts == 0 { text_of(KEY_BASE) } else { None };
        let (journal, bad) = format::parse(&journal_text, true);
        unreadable += bad;

        let mut base = ShardMap::default();
        let mut coverage = Coverage::default();
        let mut digests = vec![0; parts as usize];
        let mut base_bytes = 0;
        if let Some(text) = &base_text {
            let (lines, bad) = format::parse(text, false);
            unreadable += bad;
            for (key, hash) in lines {
                base.insert(key, hash.unwrap_or_default());
            }
            base_bytes = inline.as_ref().map_or(0, Vec::len);
        }
        let mut other_layouts = BTreeMap::new();
        if parts > 0 {
            let read = self.read_layouts(parts).await?;
            unreadable += read.unreadable;
            for (key, hash) in read.lines {
                base.insert(key, hash);
            }
            (digests, coverage.parts, other_layouts) = (read.digests, read.coverage, read.other_layouts);
            base_bytes += read.bytes;
        }
        let readable = base.len() + journal.len() + other_layouts.values().map(Vec::len).sum::<usize>();
        if self.counted_unreadable(unreadable, readable).is_none() {
            return Ok(None);
        }
        // Base entries of the other layout first, so the head's layout wins where both hold one.
        let mut entries: HashMap<ResourceKey, ShortHash> = other_layouts.into_values().flatten().collect();
        entries.extend(base.iter().map(|(k, h)| (k, *h)));
        for (key, hash) in journal {
            match hash {
                Some(hash) => entries.insert(key.clone(), hash),
                None => entries.remove(&key),
            };
            coverage.journaled.insert(key);
        }
        let whole =
            parts == 0 && base_text.is_some() || coverage.parts.get(&parts).is_some_and(|r| r.len() == parts as usize);
        if !whole {
            self.rejected = Some("partial");
            warn!(namespace = %self.namespace, name = %self.name,
                "parts of the checkpoint are missing or unreadable; their resources are taken as baseline");
        }
        self.written = Some(Written {
            base: Arc::new(base),
            parts,
            inline: Arc::new(inline.unwrap_or_default()),
            digests,
            base_bytes,
            journal: (format::digest(&journal_text), binary.get(KEY_JOURNAL).map_or(0, |b| b.0.len())),
        });
        Ok(Some(Loaded { entries, coverage: (!whole).then_some(coverage) }))
    }

    /// Read the parts of a head of `parts` parts. A part of another layout (a rewrite cut
    /// short) makes that layout's parts worth reading too: each resource is whole in one of the
    /// two (`write_parts`).
    async fn read_layouts(&mut self, parts: u32) -> Result<PartsRead, Error> {
        let mut out = PartsRead { digests: vec![0; parts as usize], ..PartsRead::default() };
        let mut wanted: BTreeSet<u32> = (0..parts).collect();
        let mut read: BTreeSet<u32> = BTreeSet::new();
        while !wanted.is_empty() {
            let batch: Vec<u32> = std::mem::take(&mut wanted).into_iter().collect();
            read.extend(&batch);
            for (i, part) in self.read_parts(&batch).await? {
                let Some(part) = part else {
                    out.unreadable += 1;
                    continue;
                };
                out.unreadable += part.unreadable;
                if part.layout == parts {
                    out.digests[i as usize] = part.digest;
                    out.bytes += part.bytes;
                    out.lines.extend(part.lines);
                } else {
                    wanted.extend((0..part.layout).filter(|p| !read.contains(p)));
                    out.other_layouts.entry(part.layout).or_default().extend(part.lines);
                }
                out.coverage.entry(part.layout).or_default().insert(i);
            }
        }
        Ok(out)
    }

    /// Read parts `batch` (a few at once); per part, what it holds (`None`: missing, not ours
    /// or unreadable).
    async fn read_parts(&mut self, batch: &[u32]) -> Result<Vec<(u32, Option<ReadPart>)>, Error> {
        let this = &*self;
        let found: Vec<(u32, Option<ConfigMap>)> = futures::stream::iter(batch.iter().copied())
            .map(|i| async move { Ok::<_, Error>((i, this.get(&Self::part_name(&this.name, i)).await?)) })
            .buffer_unordered(PARTS_AT_ONCE)
            .try_collect()
            .await?;
        Ok(found
            .into_iter()
            .map(|(i, cm)| {
                self.part_versions[i as usize] = cm.as_ref().and_then(|c| c.metadata.resource_version.clone());
                (i, cm.and_then(|cm| read_part(&cm, i)))
            })
            .collect())
    }

    /// Write `entries` as the shard's checkpoint: the head with a journal of what differs from
    /// the base while the journal is small, else the base again (see the module doc). A save
    /// of what the checkpoint holds already writes nothing.
    ///
    /// # Errors
    /// When an object cannot be written (nothing is then known written: the next save tries
    /// again from the same base), or the shard is too large to fit.
    pub async fn save(&mut self, entries: &ShardMap) -> Result<Saved, Error> {
        if let Some(written) = &self.written
            && self.stale_parts.is_empty()
        {
            let text = format::render(journal(&written.base, entries).iter().map(|(k, h)| (k, *h)));
            let digest = format::digest(&text);
            if digest == written.journal.0 {
                return Ok(Saved { stored: written.base_bytes + written.journal.1, ..Saved::default() });
            }
            let packed = format::compress(&text);
            // The base is written again once the journal outgrows it by half (or JOURNAL_MAX),
            // or once most of the base is gone (its parts then go too).
            let small = packed.len() <= JOURNAL_MAX.min(written.base_bytes / 2).max(4 << 10);
            if small && entries.len() * 2 >= written.base.len() {
                let (parts, inline, base_bytes, count) =
                    (written.parts, written.inline.clone(), written.base_bytes, entries.len());
                let bytes = self.write_head(parts, &inline, &packed, count).await?;
                if let Some(written) = self.written.as_mut() {
                    written.journal = (digest, packed.len());
                }
                return Ok(Saved { bytes, objects: 1, stored: base_bytes + packed.len() });
            }
        }
        self.rewrite(entries).await
    }

    /// Write the base again (the parts whose text changed, then the head with an empty
    /// journal), choosing the layout for its size.
    async fn rewrite(&mut self, entries: &ShardMap) -> Result<Saved, Error> {
        let previous = self.written.as_ref().map_or(0, |w| w.parts);
        let per_entry =
            self.written.as_ref().filter(|w| !w.base.is_empty()).map_or(16, |w| w.base_bytes / w.base.len());
        let Some(Cut { parts, inline, packed }) = cut(entries, previous, per_entry) else {
            return Err(Error::TooLarge {
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                entries: entries.len(),
            });
        };
        let (mut bytes, mut objects) = self.write_parts(previous, &packed).await?;
        let empty = format::compress("");
        bytes += self.write_head(parts, &inline, &empty, entries.len()).await?;
        objects += 1;
        let base_bytes = inline.len() + packed.iter().map(|(_, b)| b.len()).sum::<usize>();
        // The parts no layout reads any more: after the head, best effort (a leftover part is
        // never read, or read as an older layout: it can only lag).
        self.stale_parts.extend(parts..previous.max(parts));
        self.delete_stale_parts().await;
        self.written = Some(Written {
            base: Arc::new(entries.clone()),
            parts,
            inline: Arc::new(inline),
            digests: packed.iter().map(|(digest, _)| *digest).collect(),
            base_bytes,
            journal: (format::digest(""), empty.len()),
        });
        Ok(Saved { bytes, objects, stored: base_bytes + empty.len() })
    }

    /// Write the parts of a new base (`packed`: per part, its text's digest and compressed
    /// text), skipping those that hold the same text already. The order keeps every resource
    /// whole in the old or the new layout at each step, so a save cut short anywhere reads
    /// back: growing, the new parts past the old count first (no one reads them yet), then
    /// parts 0.. in order (a resource's old part `b` is overwritten only once its new part,
    /// `b` or one past the old count, is written); shrinking, parts 0.. in order (a part is
    /// overwritten by the part its resources move to).
    async fn write_parts(&mut self, previous: u32, packed: &[(u64, Vec<u8>)]) -> Result<(usize, usize), Error> {
        let parts = packed.len() as u32;
        let same_layout = previous == parts;
        let (mut bytes, mut objects) = (0, 0);
        for i in write_order(previous, parts) {
            let (digest, text) = &packed[i as usize];
            let unchanged = same_layout
                && self.written.as_ref().is_some_and(|w| w.digests.get(i as usize) == Some(digest))
                && self.part_versions[i as usize].is_some();
            if unchanged {
                continue;
            }
            let mut cm = self.object(&Self::part_name(&self.name, i));
            cm.data = Some(BTreeMap::from([(KEY_LAYOUT.to_string(), format!("{i}/{parts}"))]));
            cm.binary_data = Some(BTreeMap::from([(KEY_ENTRIES.to_string(), ByteString(text.clone()))]));
            let version = self.part_versions[i as usize].clone();
            let (written, sent) = self.put(cm, version).await?;
            self.part_versions[i as usize] = written;
            self.stale_parts.remove(&i);
            bytes += sent;
            objects += 1;
        }
        Ok((bytes, objects))
    }

    async fn write_head(&mut self, parts: u32, inline: &[u8], journal: &[u8], entries: usize) -> Result<usize, Error> {
        let mut cm = self.object(&self.name);
        cm.data = Some(BTreeMap::from([
            (KEY_FORMAT.to_string(), FORMAT.to_string()),
            (KEY_PARTS.to_string(), parts.to_string()),
            (KEY_ENTRIES.to_string(), entries.to_string()),
        ]));
        let mut binary = BTreeMap::from([(KEY_JOURNAL.to_string(), ByteString(journal.to_vec()))]);
        if parts == 0 {
            binary.insert(KEY_BASE.to_string(), ByteString(inline.to_vec()));
        }
        cm.binary_data = Some(binary);
        cm.metadata.annotations =
            Some(BTreeMap::from([(SAVED_AT_ANNOTATION.to_string(), jiff::Timestamp::now().to_string())]));
        let (version, sent) = self.put(cm, self.head_version.clone()).await?;
        self.head_version = version;
        Ok(sent)
    }

    /// A ConfigMap of this checkpoint, with its labels.
    fn object(&self, name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(self.namespace.clone()),
                labels: Some(BTreeMap::from([
                    (MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string()),
                    (INTERNAL_LABEL.to_string(), "checkpoint".to_string()),
                ])),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    /// Create or replace `cm` at `version` (guarded by it). Someone else's write (409) is read
    /// again and overwritten: this replica owns the checkpoint while it acts on the shard.
    /// Returns the new resourceVersion and the bytes sent.
    async fn put(&self, mut cm: ConfigMap, mut version: Option<String>) -> Result<(Option<String>, usize), Error> {
        let name = cm.metadata.name.clone().unwrap_or_default();
        let mut sent = 0;
        for _ in 0..3 {
            cm.metadata.resource_version = version.clone();
            sent += wire_bytes(&cm);
            let result = match &version {
                None => timed(self.api.create(&PostParams::default(), &cm)).await,
                Some(_) => timed(self.api.replace(&name, &PostParams::default(), &cm)).await,
            };
            match result.map_err(|e| self.error(&name, e)) {
                Ok(written) => return Ok((written.metadata.resource_version, sent)),
                Err(err) if err.code() == Some(409) => {
                    version = self.get(&name).await?.and_then(|c| c.metadata.resource_version);
                }
                Err(err) if err.code() == Some(404) => version = None,
                Err(err) => return Err(err),
            }
        }
        Err(Error::Refused {
            namespace: self.namespace.clone(),
            name,
            code: 409,
            message: "written by someone else at each of three tries".to_string(),
        })
    }

    async fn delete_stale_parts(&mut self) {
        for i in std::mem::take(&mut self.stale_parts) {
            let name = Self::part_name(&self.name, i);
            match timed(self.api.delete(&name, &DeleteParams::default())).await {
                Ok(_) => self.part_versions[i as usize] = None,
                Err(kube::Error::Api(status)) if status.code == 404 => self.part_versions[i as usize] = None,
                Err(err) => {
                    warn!(namespace = %self.namespace, name, error = %err, "cannot delete a part of an earlier checkpoint layout; trying again at the next save");
                    self.stale_parts.insert(i);
                }
            }
        }
    }
}

/// What a part holds.
/// What the parts of a checkpoint held: the lines of the head's layout, with each part's
/// digest and the bytes they take, the lines of another layout, and which parts of each layout
/// were read.
#[derive(Default)]
struct PartsRead {
    lines: Vec<(ResourceKey, ShortHash)>,
    digests: Vec<u64>,
    bytes: usize,
    other_layouts: BTreeMap<u32, Vec<(ResourceKey, ShortHash)>>,
    coverage: BTreeMap<u32, BTreeSet<u32>>,
    unreadable: usize,
}

struct ReadPart {
    layout: u32,
    lines: Vec<(ResourceKey, ShortHash)>,
    unreadable: usize,
    digest: u64,
    bytes: usize,
}

/// A part, if it is ours, says it is part `i`, and unpacks; its lines of the right part only
/// (a line in the wrong part is not one this controller wrote).
fn read_part(cm: &ConfigMap, i: u32) -> Option<ReadPart> {
    if !is_ours(cm) {
        return None;
    }
    let layout = cm.data.as_ref()?.get(KEY_LAYOUT)?;
    let (index, layout) = layout.split_once('/')?;
    let (index, layout) = (index.parse::<u32>().ok()?, layout.parse::<u32>().ok()?);
    if index != i || layout == 0 || !is_layout(layout) {
        return None;
    }
    let packed = &cm.binary_data.as_ref()?.get(KEY_ENTRIES)?.0;
    let text = format::decompress(packed)?;
    let (lines, mut unreadable) = format::parse(&text, false);
    let total = lines.len();
    let lines: Vec<(ResourceKey, ShortHash)> = lines
        .into_iter()
        .filter(|(key, _)| format::part_of(key, layout) == i)
        .filter_map(|(key, hash)| Some((key, hash?)))
        .collect();
    unreadable += total - lines.len();
    Some(ReadPart { layout, lines, unreadable, digest: format::digest(&text), bytes: packed.len() })
}

fn is_ours(cm: &ConfigMap) -> bool {
    let labels = cm.metadata.labels.as_ref();
    labels.and_then(|l| l.get(MANAGED_BY.0)).map(String::as_str) == Some(MANAGED_BY.1)
}

/// 0 (inline) or a power of two up to [`MAX_PARTS`].
fn is_layout(parts: u32) -> bool {
    parts == 0 || (parts.is_power_of_two() && parts <= MAX_PARTS)
}

/// The part count for about `bytes` compressed: parts of [`PART_TARGET`] or less, a power of
/// two; the `previous` count is kept while it is within a factor of two (a base that hovers
/// around a boundary is not rewritten in another layout at every save).
fn layout_for(bytes: usize, previous: u32) -> u32 {
    let wanted = bytes.div_ceil(PART_TARGET).next_power_of_two().clamp(1, MAX_PARTS as usize) as u32;
    if is_layout(previous) && wanted <= previous && wanted * 4 > previous { previous } else { wanted }
}

/// The order parts are written in when `previous` parts become `parts` (see
/// [`Checkpoint::write_parts`]).
fn write_order(previous: u32, parts: u32) -> impl Iterator<Item = u32> {
    (previous.min(parts)..parts).chain(0..previous.min(parts))
}

/// A base cut for its size: in the head (`parts` 0, `inline`), or in parts (each part's text
/// digest and compressed text).
struct Cut {
    parts: u32,
    inline: Vec<u8>,
    packed: Vec<(u64, Vec<u8>)>,
}

/// Cut `entries` into the layout for their size (see [`layout_for`]); `per_entry`: the
/// compressed bytes a resource took last time, to guess the layout before compressing.
/// `None` when they do not fit in [`MAX_PARTS`] parts.
fn cut(entries: &ShardMap, previous: u32, per_entry: usize) -> Option<Cut> {
    let estimate = entries.len() * per_entry.clamp(8, 256);
    // Near the line, compressing once tells (an estimate is a guess: names differ by cluster).
    let mut parts = if estimate <= INLINE_MAX * 2 { 0 } else { layout_for(estimate, previous) };
    loop {
        if parts == 0 {
            let packed = format::compress(&format::render(entries.iter().map(|(k, h)| (k, Some(*h)))));
            if packed.len() <= INLINE_MAX {
                return Some(Cut { parts, inline: packed, packed: Vec::new() });
            }
            parts = layout_for(packed.len(), previous);
            continue;
        }
        let packed = pack_parts(entries, parts);
        if packed.iter().all(|(_, bytes)| bytes.len() <= MAX_OBJECT) {
            return Some(Cut { parts, inline: Vec::new(), packed });
        }
        if parts >= MAX_PARTS {
            return None;
        }
        parts *= 2;
    }
}

/// What the checkpoint of `entries` takes as a save would write it: the parts it is cut into
/// (0: in the head) and its compressed bytes; `None` when it does not fit. For sizing (`cargo
/// bench --bench placement`).
pub fn footprint(entries: &ShardMap) -> Option<(u32, usize)> {
    let Cut { parts, inline, packed } = cut(entries, 0, 16)?;
    Some((parts, inline.len() + packed.iter().map(|(_, b)| b.len()).sum::<usize>()))
}

/// The text of each of `parts` parts of `entries`: its digest and compressed form.
fn pack_parts(entries: &ShardMap, parts: u32) -> Vec<(u64, Vec<u8>)> {
    let mut split: Vec<Vec<(ResourceKey, Option<ShortHash>)>> = vec![Vec::new(); parts as usize];
    for (key, hash) in entries.iter() {
        split[format::part_of(&key, parts) as usize].push((key, Some(*hash)));
    }
    split
        .iter()
        .map(|lines| {
            let text = format::render(lines.iter().map(|(k, h)| (k, *h)));
            (format::digest(&text), format::compress(&text))
        })
        .collect()
}

/// What `entries` changes of `base`: new and changed entries, and removals.
fn journal(base: &ShardMap, entries: &ShardMap) -> Vec<(ResourceKey, Option<ShortHash>)> {
    let mut lines: Vec<(ResourceKey, Option<ShortHash>)> =
        entries.iter().filter(|(key, hash)| base.get(key) != Some(hash)).map(|(k, h)| (k, Some(*h))).collect();
    lines.extend(base.iter().filter(|(key, _)| entries.get(key).is_none()).map(|(k, _)| (k, None)));
    lines
}

/// About the bytes of `cm` as JSON on the wire (binary data goes as base64).
fn wire_bytes(cm: &ConfigMap) -> usize {
    let data: usize = cm.data.iter().flatten().map(|(k, v)| k.len() + v.len() + 8).sum();
    let binary: usize = cm.binary_data.iter().flatten().map(|(k, v)| k.len() + v.0.len().div_ceil(3) * 4 + 8).sum();
    512 + data + binary
}

#[cfg(test)]
mod tests;
