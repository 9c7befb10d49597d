// Copyright (c) 2024-present, fjall-rs
// This source code is licensed under both the Apache 2.0 and MIT License
// (found in the LICENSE-* files in the repository)

use super::entry::{serialize_marker_item, Entry};
use crate::{
    batch::item::Item as BatchItem, file::fsync_directory, journal::recovery::JournalId,
    keyspace::InternalKeyspaceId,
};
use lsm_tree::{CompressionType, SeqNo, ValueType};
use std::{
    fs::{File, OpenOptions},
    hash::Hasher,
    io::{BufWriter, Seek, Write},
    path::{Path, PathBuf},
};

// TODO: this should be a database configuration
pub const PRE_ALLOCATED_BYTES: u64 = 64 * 1_024 * 1_024;

pub const JOURNAL_BUFFER_BYTES: usize = 8 * 1_024;

/// eventfold patch: spare journals, zero-filled ahead of their use.
///
/// A new journal used to be a sparse file (`set_len` of [`PRE_ALLOCATED_BYTES`]), so every
/// write into it allocated blocks, and every `fdatasync` then also had to write the
/// file's inode (its block map changed). On ext4 that was a third of the time a group
/// commit waited for its fsync. Once a quarter of a journal is written, a thread writes
/// the *next* one's file full of zeros (same length, so fjall's journal size accounting
/// is unchanged), syncs it and renames it `<id>.jnl.spare`; the rotation to `<id>` renames
/// it into place instead of creating a sparse file (which it still does when no spare is
/// ready). Recovery reads a zero-filled tail as it reads a sparse one (zeros end the
/// journal, and it is truncated there), and ignores `*.spare` / `*.tmp` files; a spare
/// left behind is removed by the next preparation.
pub(crate) mod spare {
    use super::PRE_ALLOCATED_BYTES;
    use std::{
        fs::{File, OpenOptions},
        io::Write,
        path::{Path, PathBuf},
    };

    fn id_of(path: &Path) -> Option<u64> {
        path.file_name()?.to_str()?.split('.').next()?.parse().ok()
    }

    /// Takes the spare prepared for journal `path` (`<folder>/<id>.jnl`), if it is ready.
    pub fn take(path: &Path) -> Option<File> {
        let (folder, id) = (path.parent()?, id_of(path)?);
        std::fs::rename(folder.join(format!("{id}.jnl.spare")), path).ok()?;
        match OpenOptions::new().write(true).open(path) {
            Ok(file) => Some(file),
            Err(e) => {
                log::warn!("could not open spare journal {}: {e:?}", path.display());
                let _ = std::fs::remove_file(path);
                None
            }
        }
    }

    /// Starts preparing the spare of the journal after `path`.
    pub fn prepare_after(path: &Path) {
        if let (Some(folder), Some(id)) = (path.parent(), id_of(path)) {
            prepare(folder.to_path_buf(), id + 1);
        }
    }

    /// Writes `<folder>/<id>.jnl.spare` on a thread of its own.
    fn prepare(folder: PathBuf, id: u64) {
        let spawned = std::thread::Builder::new()
            .name("fjall:spare-journal".into())
            .spawn(move || {
                crate::background_thread_started();
                if let Err(e) = write(&folder, id) {
                    log::warn!("could not prepare spare journal {id} in {}: {e:?}", folder.display());
                }
            });
        if let Err(e) = spawned {
            log::warn!("could not start the spare journal thread: {e:?}");
        }
    }

    fn write(folder: &Path, id: u64) -> std::io::Result<()> {
        // Spares of earlier ids were not taken in time: they will never be.
        for dirent in std::fs::read_dir(folder)? {
            let p = dirent?.path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if (name.ends_with(".jnl.spare") || name.ends_with(".jnl.spare.tmp"))
                && id_of(&p).is_some_and(|i| i < id)
            {
                let _ = std::fs::remove_file(&p);
            }
        }
        let tmp = folder.join(format!("{id}.jnl.spare.tmp"));
        let mut file = File::create(&tmp)?;
        let zeros = vec![0u8; 1 << 20];
        let mut left = PRE_ALLOCATED_BYTES;
        while left > 0 {
            let n = left.min(zeros.len() as u64) as usize;
            file.write_all(&zeros[..n])?;
            left -= n as u64;
        }
        file.sync_all()?;
        std::fs::rename(&tmp, folder.join(format!("{id}.jnl.spare")))
    }
}

pub struct Writer {
    pub(crate) path: PathBuf,
    file: BufWriter<File>,
    buf: Vec<u8>,
    is_buffer_dirty: bool,
    /// eventfold patch: bytes written through this writer, and whether the spare of the
    /// next journal is being prepared (see `spare`).
    written: u64,
    spare_requested: bool,
    /// eventfold patch: whether spares are prepared at all (`Config::spare_journals`).
    spare_enabled: bool,

    compression: CompressionType,
    compression_threshold: usize,
}

/// The persist mode allows setting the durability guarantee of previous writes
#[derive(Copy, Clone, Debug, Eq, PartialEq)]
pub enum PersistMode {
    /// Flushes data to OS buffers. This allows the OS to write out data in case of an
    /// application crash.
    ///
    /// When this function returns, data is **not** guaranteed to be persisted in case
    /// of a power loss event or OS crash.
    Buffer,

    /// Flushes data using `fdatasync`.
    ///
    /// Use if you know that `fdatasync` is sufficient for your file system and/or operating system.
    SyncData,

    /// Flushes data + metadata using `fsync`.
    SyncAll,
}

impl Writer {
    pub fn set_compression(&mut self, comp: CompressionType, threshold: usize) {
        self.compression = comp;
        self.compression_threshold = threshold;
    }

    /// eventfold patch: whether the next journal is zero-filled ahead (see `spare`).
    pub fn set_spare_journals(&mut self, enabled: bool) {
        self.spare_enabled = enabled;
    }

    pub fn pos(&mut self) -> crate::Result<u64> {
        self.file.stream_position().map_err(Into::into)
    }

    pub fn len(&self) -> crate::Result<u64> {
        Ok(self.file.get_ref().metadata()?.len())
    }

    pub fn rotate(&mut self) -> crate::Result<(PathBuf, PathBuf)> {
        self.persist(PersistMode::SyncAll)?;

        log::debug!(
            "Sealing active journal at {}, len={}B",
            self.path.display(),
            self.path
                .metadata()
                .inspect_err(|e| {
                    log::error!(
                        "Failed to get file metadata of journal file at {}: {e:?}",
                        self.path.display()
                    );
                })?
                .len(),
        );

        let prev_path = self.path.clone();

        let folder = self
            .path
            .parent()
            .expect("should have parent")
            .to_path_buf();

        let Some(basename) = self
            .path
            .file_name()
            .expect("should be valid file name")
            .to_str()
            .expect("should be valid utf-8")
            .strip_suffix(".jnl")
        else {
            log::error!("Invalid journal file name: {}", self.path.display());
            return Err(crate::Error::JournalRecovery(
                crate::JournalRecoveryError::InvalidFileName,
            ));
        };

        let journal_id = basename.parse::<JournalId>().map_err(|_| {
            log::error!("Invalid journal file name: {}", self.path.display());
            crate::Error::JournalRecovery(crate::JournalRecoveryError::InvalidFileName)
        })?;

        let new_path = folder.join(format!("{}.jnl", journal_id + 1));
        log::debug!("Rotating active journal to {}", new_path.display());

        let comp = self.compression;
        let compt = self.compression_threshold;
        let spare = self.spare_enabled;
        *self = Self::create_new(new_path.clone())?;
        self.set_compression(comp, compt);
        self.spare_enabled = spare;

        // IMPORTANT: fsync folder on Unix
        fsync_directory(&folder)?;

        Ok((prev_path, new_path))
    }

    pub fn create_new<P: Into<PathBuf>>(path: P) -> crate::Result<Self> {
        let path = path.into();

        // eventfold patch: a journal zero-filled ahead of time, if one is ready (see `spare`).
        let file = match spare::take(&path) {
            Some(file) => file,
            None => Self::create_sparse(&path)?,
        };

        Ok(Self {
            path,
            file: BufWriter::new(file),
            buf: Vec::new(),
            is_buffer_dirty: false,
            written: 0,
            spare_requested: false,
            spare_enabled: true,
            compression: CompressionType::None,
            compression_threshold: 0,
        })
    }

    fn create_sparse(path: &Path) -> crate::Result<File> {
        let file = File::create_new(path).inspect_err(|e| {
            log::error!("Failed to create journal file at {}: {e:?}", path.display());
        })?;

        file.set_len(PRE_ALLOCATED_BYTES).inspect_err(|e| {
            log::error!(
                "Failed to set journal file size to {PRE_ALLOCATED_BYTES}B at {}: {e:?}",
                path.display(),
            );
        })?;

        file.sync_all().inspect_err(|e| {
            log::error!("Failed to fsync journal file at {}: {e:?}", path.display());
        })?;

        Ok(file)
    }

    pub fn from_file<P: AsRef<Path>>(path: P) -> crate::Result<Self> {
        let path = path.as_ref();

        if !path.try_exists()? {
            let file = OpenOptions::new()
                .create_new(true)
                .write(true)
                .open(path)
                .inspect_err(|e| {
                    log::error!("Failed to create journal file at {}: {e:?}", path.display());
                })?;

            file.set_len(PRE_ALLOCATED_BYTES).inspect_err(|e| {
                log::error!(
                    "Failed to set journal file size to {PRE_ALLOCATED_BYTES}B at {}: {e:?}",
                    path.display(),
                );
            })?;

            file.sync_all().inspect_err(|e| {
                log::error!("Failed to fsync journal file at {}: {e:?}", path.display());
            })?;

            return Ok(Self {
                path: path.into(),
                file: BufWriter::with_capacity(JOURNAL_BUFFER_BYTES, file),
                buf: Vec::new(),
                is_buffer_dirty: false,
                written: 0,
                spare_requested: false,
                spare_enabled: true,
                compression: CompressionType::None,
                compression_threshold: 0,
            });
        }

        let file = OpenOptions::new()
            .append(true)
            .open(path)
            .inspect_err(|e| {
                log::error!("Failed to open journal file at {}: {e:?}", path.display());
            })?;

        Ok(Self {
            path: path.into(),
            file: BufWriter::with_capacity(JOURNAL_BUFFER_BYTES, file),
            buf: Vec::new(),
            is_buffer_dirty: false,
            written: 0,
            spare_requested: false,
            spare_enabled: true,
            compression: CompressionType::None,
            compression_threshold: 0,
        })
    }

    /// eventfold patch: writes the buffered journal bytes to the OS and returns another
    /// handle to the journal file, so that the caller can fsync what was written so far
    /// without holding the writer.
    pub(crate) fn sync_handle(&mut self) -> std::io::Result<File> {
        self.persist(PersistMode::Buffer)?;
        self.file.get_ref().try_clone()
    }

    /// eventfold patch: once a quarter of this journal's preallocated bytes are written,
    /// the next journal is zero-filled in the background (a store that never fills a
    /// journal never pays for a spare).
    fn wrote(&mut self, bytes: u64) {
        self.written += bytes;
        if self.spare_enabled && !self.spare_requested && self.written >= PRE_ALLOCATED_BYTES / 4 {
            self.spare_requested = true;
            spare::prepare_after(&self.path);
        }
    }

    /// Persists the journal file.
    pub(crate) fn persist(&mut self, mode: PersistMode) -> std::io::Result<()> {
        log::trace!(
            "Persisting journal at {} with mode={mode:?}",
            self.path.display(),
        );

        if self.is_buffer_dirty {
            self.file.flush().inspect_err(|e| {
                log::error!(
                    "Failed to flush journal IO buffers at {}: {e:?}",
                    self.path.display(),
                );
            })?;
            self.is_buffer_dirty = false;
        }

        match mode {
            PersistMode::SyncAll => self.file.get_mut().sync_all().inspect_err(|e| {
                log::error!(
                    "Failed to fsync journal file at {}: {e:?}",
                    self.path.display(),
                );
            }),
            PersistMode::SyncData => self.file.get_mut().sync_data().inspect_err(|e| {
                log::error!(
                    "Failed to fsyncdata journal file at {}: {e:?}",
                    self.path.display(),
                );
            }),
            PersistMode::Buffer => Ok(()),
        }
    }

    /// Writes a batch start marker to the journal
    fn write_start(&mut self, item_count: u32, seqno: SeqNo) -> Result<usize, crate::Error> {
        debug_assert!(self.buf.is_empty());

        Entry::Start { item_count, seqno }.encode_into(&mut self.buf)?;

        self.file.write_all(&self.buf)?;

        Ok(self.buf.len())
    }

    /// Writes a batch end marker to the journal
    fn write_end(&mut self, checksum: u64) -> Result<usize, crate::Error> {
        debug_assert!(self.buf.is_empty());

        Entry::End(checksum).encode_into(&mut self.buf)?;

        self.file.write_all(&self.buf)?;

        Ok(self.buf.len())
    }

    pub(crate) fn write_raw(
        &mut self,
        keyspace_id: InternalKeyspaceId,
        key: &[u8],
        value: &[u8],
        value_type: ValueType,
        seqno: u64,
    ) -> crate::Result<usize> {
        self.is_buffer_dirty = true;

        let mut hasher = xxhash_rust::xxh3::Xxh3::default();
        let mut byte_count = 0;

        self.buf.clear();
        byte_count += self.write_start(1, seqno)?;
        self.buf.clear();

        serialize_marker_item(
            &mut self.buf,
            keyspace_id,
            key,
            value,
            value_type,
            if self.compression_threshold > 0 && value.len() >= self.compression_threshold {
                self.compression
            } else {
                CompressionType::None
            },
        )?;

        self.file.write_all(&self.buf)?;

        hasher.update(&self.buf);
        byte_count += self.buf.len();

        self.buf.clear();
        let checksum = hasher.finish();
        byte_count += self.write_end(checksum)?;

        self.wrote(byte_count as u64);
        Ok(byte_count)
    }

    pub(crate) fn write_clear(
        &mut self,
        keyspace_id: InternalKeyspaceId,
        seqno: SeqNo,
    ) -> crate::Result<usize> {
        self.is_buffer_dirty = true;

        let mut hasher = xxhash_rust::xxh3::Xxh3::default();
        let mut byte_count = 0;

        self.buf.clear();
        byte_count += self.write_start(1, seqno)?;
        self.buf.clear();

        Entry::Clear { keyspace_id }.encode_into(&mut self.buf)?;
        self.file.write_all(&self.buf)?;
        hasher.update(&self.buf);
        byte_count += self.buf.len();

        self.buf.clear();
        let checksum = hasher.finish();
        byte_count += self.write_end(checksum)?;

        self.wrote(byte_count as u64);
        Ok(byte_count)
    }

    pub fn write_batch<'a>(
        &mut self,
        items: impl Iterator<Item = &'a BatchItem>,
        batch_size: usize,
        seqno: SeqNo,
    ) -> crate::Result<usize> {
        if batch_size == 0 {
            return Ok(0);
        }

        self.is_buffer_dirty = true;

        self.buf.clear();

        // NOTE: entries.len() is surely never > u32::MAX
        #[expect(clippy::cast_possible_truncation)]
        let item_count = batch_size as u32;

        let mut hasher = xxhash_rust::xxh3::Xxh3::default();
        let mut byte_count = 0;

        byte_count += self.write_start(item_count, seqno)?;
        self.buf.clear();

        for item in items {
            debug_assert!(self.buf.is_empty());

            serialize_marker_item(
                &mut self.buf,
                item.keyspace.id,
                &item.key,
                &item.value,
                item.value_type,
                if self.compression_threshold > 0 && item.value.len() >= self.compression_threshold
                {
                    self.compression
                } else {
                    CompressionType::None
                },
            )?;

            self.file.write_all(&self.buf)?;

            hasher.update(&self.buf);
            byte_count += self.buf.len();

            self.buf.clear();
        }

        let checksum = hasher.finish();
        byte_count += self.write_end(checksum)?;

        self.wrote(byte_count as u64);
        Ok(byte_count)
    }
}
