//! Byte formats of stored values. Integers have explicit widths and are big-endian in
//! keys (so they sort) and little-endian in values. Every value is framed as
//! `crc32(u32 LE) | format(u8) | payload`, the CRC covering format and payload.
//!
//! Log records have three payload formats, all read: v1 ([`encode_record`]), v2 (read
//! by `decode_record_v2`), which codes the standard header names in one byte and lengths
//! as varints (an event record of the shop took about 300 bytes instead of 440), and v3
//! ([`encode_record_v3`], what the store writes), which also writes a header value equal
//! to the key or to an earlier header's value as a reference to it: an event's
//! `ef-aggregate-id` is its key, and its `ef-causation-id` and (unless the caller set
//! another) `ef-correlation-id` are its `ef-command-id`, 36-byte ids each.

use eventfold_core::envelope::{STANDARD_NAME, headers};
use eventfold_core::{Record, RecordRef};
use fjall::Slice;

/// The frame format of every value but v2 and v3 log records; v1 log record payloads.
pub const FORMAT_V1: u8 = 1;

/// The frame format of log records laid out as `decode_record_v2` reads them (written by
/// builds before v3).
pub const FORMAT_RECORD_V2: u8 = 2;

/// The frame format of log records written as [`encode_record_v3`] lays them out.
pub const FORMAT_RECORD_V3: u8 = 3;

/// `payload` framed with format byte and checksum, as a store value (see [`slice_of`]).
pub(crate) fn framed(payload: &[u8]) -> Slice {
    slice_of(&[&frame_crc(FORMAT_V1, payload).to_le_bytes(), &[FORMAT_V1], payload])
}

/// The checksum of a frame: the CRC of its format byte and `covered`.
pub(crate) fn frame_crc(format: u8, covered: &[u8]) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&[format]);
    crc.update(covered);
    crc.finalize()
}

/// `parts` one after the other as a store key or value, written straight into fjall's
/// byte type: one allocation of the exact size (none for up to 20 bytes, held inline),
/// and nothing to copy when fjall takes it.
pub(crate) fn slice_of(parts: &[&[u8]]) -> Slice {
    let mut out = byteview::ByteView::with_size(parts.iter().map(|p| p.len()).sum());
    {
        let mut bytes = out.get_mut().expect("a new view is not shared");
        let mut at = 0;
        for p in parts {
            bytes[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
    }
    Slice::from(out)
}

/// Checks a frame of format v1 and returns its payload.
pub fn unframe(bytes: &[u8]) -> Result<&[u8], String> {
    match unframe_any(bytes)? {
        (FORMAT_V1, payload) => Ok(payload),
        (format, _) => Err(format!("unknown format version {format}")),
    }
}

/// Checks a frame and returns its format byte and payload.
fn unframe_any(bytes: &[u8]) -> Result<(u8, &[u8]), String> {
    if bytes.len() < 5 {
        return Err(format!("value of {} bytes is shorter than a frame header", bytes.len()));
    }
    let stored = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    let actual = crc32fast::hash(&bytes[4..]);
    if stored != actual {
        return Err(format!(
            "checksum mismatch (stored {stored:#010x}, computed {actual:#010x})"
        ));
    }
    Ok((bytes[4], &bytes[5..]))
}

/// A log record, framed as v3 (the format the store writes): one allocation of the exact
/// size, the checksum computed in place.
pub fn framed_record(r: &Record) -> Slice {
    let mut size = 5 + 8 + varint_len(r.key.len()) + r.key.len() + varint_len(r.headers.len()) + r.value.len();
    for (i, (k, v)) in r.headers.iter().enumerate() {
        size += 1 + match value_ref(r, i) {
            Some(to) => varint_len(to << 1 | 1),
            None => varint_len(v.len() << 1) + v.len(),
        };
        if headers::index(k.as_bytes()).is_none() {
            size += varint_len(k.len()) + k.len();
        }
    }
    let mut out = byteview::ByteView::with_size(size);
    {
        let mut bytes = out.get_mut().expect("a new view is not shared");
        let mut w = Writer {
            buf: &mut bytes[4..],
            at: 0,
        };
        w.put(&[FORMAT_RECORD_V3]);
        encode_record_v3(r, &mut w);
        debug_assert_eq!(w.at + 4, size);
        let crc = crc32fast::hash(&bytes[4..]);
        bytes[..4].copy_from_slice(&crc.to_le_bytes());
    }
    Slice::from(out)
}

/// How many headers before a value [`value_ref`] looks through for the same value: the
/// standard ones are 10, and a record with thousands of headers must not cost a
/// quadratic search.
const REPEAT_WINDOW: usize = 32;

/// What header `i`'s value is written as in v3: a reference to the key (0) or to an
/// earlier header `j` (`j + 1`, one of the [`REPEAT_WINDOW`] first) with the same value,
/// or `None` (the bytes themselves). Values under 2 bytes are not worth a reference.
fn value_ref(r: &Record, i: usize) -> Option<usize> {
    let v = &r.headers[i].1;
    if v.len() < 2 {
        return None;
    }
    if r.key == *v {
        return Some(0);
    }
    r.headers[..i.min(REPEAT_WINDOW)]
        .iter()
        .position(|(_, earlier)| earlier == v)
        .map(|j| j + 1)
}

/// Writes into a buffer sized beforehand.
struct Writer<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn put(&mut self, part: &[u8]) {
        self.buf[self.at..self.at + part.len()].copy_from_slice(part);
        self.at += part.len();
    }

    fn varint(&mut self, mut n: usize) {
        while n >= 0x80 {
            self.put(&[n as u8 | 0x80]);
            n >>= 7;
        }
        self.put(&[n as u8]);
    }
}

/// Bytes of `n` as a LEB128 varint.
fn varint_len(n: usize) -> usize {
    (usize::BITS - (n | 1).leading_zeros()).div_ceil(7) as usize
}

/// Encodes a record payload in format v3: `ts i64 | keylen varint, key | n varint |
/// (code u8, [len varint, name if code is 0], vtag varint, [v])* | value` (the value is
/// the rest). Code `i + 1` stands for the standard name `headers::ALL[i]`; names outside
/// it are spelled out after code 0. A `vtag` with its low bit clear is the value's length
/// times 2, the bytes follow; with it set, `vtag >> 1` names the value it repeats: 0 the
/// key, `j + 1` header `j`, which comes before it.
///
/// (Format v2, read by `decode_record_v2`, is `ts i64 | n varint | (code u8, [len
/// varint, name if code is 0], vlen varint, v)* | keylen varint, key | value`.)
fn encode_record_v3(r: &Record, w: &mut Writer<'_>) {
    w.put(&r.timestamp_ms.to_le_bytes());
    w.varint(r.key.len());
    w.put(&r.key);
    w.varint(r.headers.len());
    for (i, (k, v)) in r.headers.iter().enumerate() {
        match headers::index(k.as_bytes()) {
            Some(standard) => w.put(&[standard as u8 + 1]),
            None => {
                w.put(&[0]);
                w.varint(k.len());
                w.put(k.as_bytes());
            }
        }
        match value_ref(r, i) {
            Some(to) => w.varint(to << 1 | 1),
            None => {
                w.varint(v.len() << 1);
                w.put(v);
            }
        }
    }
    w.put(&r.value);
}

/// A cursor over a payload that fails with a message instead of panicking.
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.buf.len() < n {
            return Err(format!("truncated: wanted {n} bytes, {} left", self.buf.len()));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }
    pub fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }
    pub fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    pub fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    pub fn i64(&mut self) -> Result<i64, String> {
        Ok(i64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    /// A LEB128 varint of at most 32 bits.
    pub fn varint(&mut self) -> Result<u32, String> {
        let mut n = 0u32;
        for shift in (0..35).step_by(7) {
            let b = self.take(1)?[0];
            let part = u32::from(b & 0x7f);
            if shift == 28 && part > 0x0f {
                return Err("varint overflows 32 bits".to_owned());
            }
            n |= part << shift;
            if b & 0x80 == 0 {
                return Ok(n);
            }
        }
        Err("varint overflows 32 bits".to_owned())
    }
    pub fn bytes32(&mut self) -> Result<&'a [u8], String> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    pub fn rest(self) -> &'a [u8] {
        self.buf
    }
    pub fn finish(self) -> Result<(), String> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(format!("{} trailing bytes", self.buf.len()))
        }
    }
}

/// Encodes a record payload (unframed): `ts i64 | n u16 | (klen u16, k, vlen u32, v)* |
/// keylen u32, key | vlen u32, value`.
pub fn encode_record(r: &Record) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        32 + r.key.len() + r.value.len() + r.headers.iter().map(|(k, v)| k.len() + v.len() + 6).sum::<usize>(),
    );
    out.extend_from_slice(&r.timestamp_ms.to_le_bytes());
    let n = u16::try_from(r.headers.len()).expect("at most 65535 headers");
    out.extend_from_slice(&n.to_le_bytes());
    for (k, v) in &r.headers {
        let kl = u16::try_from(k.len()).expect("header name under 64 KiB");
        out.extend_from_slice(&kl.to_le_bytes());
        out.extend_from_slice(k.as_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
        out.extend_from_slice(v);
    }
    out.extend_from_slice(&(r.key.len() as u32).to_le_bytes());
    out.extend_from_slice(&r.key);
    out.extend_from_slice(&(r.value.len() as u32).to_le_bytes());
    out.extend_from_slice(&r.value);
    out
}

/// Decodes what [`encode_record`] wrote.
pub fn decode_record(buf: &[u8]) -> Result<Record, String> {
    decode_record_ref(buf, &mut Vec::new()).map(|r| r.to_record())
}

/// Checks the frame of a stored log record (format v1 or v2) and decodes it.
pub fn decode_framed_record(bytes: &[u8]) -> Result<Record, String> {
    decode_framed_record_ref(bytes, &mut Vec::new()).map(|r| r.to_record())
}

/// As [`decode_framed_record`], as views into `bytes` (see [`decode_record_ref`]).
pub fn decode_framed_record_ref<'a>(bytes: &'a [u8], at: &'a mut Vec<[u32; 4]>) -> Result<RecordRef<'a>, String> {
    match unframe_any(bytes)? {
        (FORMAT_V1, payload) => decode_record_ref(payload, at),
        (FORMAT_RECORD_V2, payload) => decode_record_v2(payload, at),
        (FORMAT_RECORD_V3, payload) => decode_record_v3(payload, at),
        (format, _) => Err(format!("unknown format version {format}")),
    }
}

/// A header name code of v2 and v3: the name's place in `buf` (for code 0, read after
/// it) or the standard name it stands for.
fn header_name(r: &mut Reader<'_>, buf: &[u8]) -> Result<[u32; 2], String> {
    match r.take(1)?[0] {
        0 => {
            let kl = r.varint()? as usize;
            let k = r.take(kl)?;
            if std::str::from_utf8(k).is_err() {
                return Err("header name is not UTF-8".to_owned());
            }
            Ok([(k.as_ptr() as usize - buf.as_ptr() as usize) as u32, k.len() as u32])
        }
        c if usize::from(c) <= headers::ALL.len() => Ok([STANDARD_NAME, u32::from(c) - 1]),
        c => Err(format!("unknown header name code {c}")),
    }
}

/// Decodes a v3 payload (see [`encode_record_v3`]) as views into `buf`: a repeated value
/// is the place of the one it repeats.
fn decode_record_v3<'a>(buf: &'a [u8], at: &'a mut Vec<[u32; 4]>) -> Result<RecordRef<'a>, String> {
    at.clear();
    let mut r = Reader::new(buf);
    let timestamp_ms = r.i64()?;
    let place = |part: &[u8]| {
        [
            (part.as_ptr() as usize - buf.as_ptr() as usize) as u32,
            part.len() as u32,
        ]
    };
    let kl = r.varint()? as usize;
    let key = r.take(kl)?;
    let key_at = place(key);
    let n = r.varint()?;
    for _ in 0..n {
        let name = header_name(&mut r, buf)?;
        let tag = r.varint()? as usize;
        let value = if tag & 1 == 0 {
            place(r.take(tag >> 1)?)
        } else {
            match tag >> 1 {
                0 => key_at,
                j => match at.get(j - 1) {
                    Some(earlier) => [earlier[2], earlier[3]],
                    None => return Err(format!("header {} repeats header {} not before it", at.len(), j - 1)),
                },
            }
        };
        at.push([name[0], name[1], value[0], value[1]]);
    }
    let value = r.rest();
    Ok(RecordRef::encoded(key, value, timestamp_ms, buf, at))
}

/// Decodes a v2 payload (its layout is in the docs of [`encode_record_v3`]) as views into `buf`.
fn decode_record_v2<'a>(buf: &'a [u8], at: &'a mut Vec<[u32; 4]>) -> Result<RecordRef<'a>, String> {
    at.clear();
    let mut r = Reader::new(buf);
    let timestamp_ms = r.i64()?;
    let n = r.varint()?;
    let offset = |part: &[u8]| (part.as_ptr() as usize - buf.as_ptr() as usize) as u32;
    for _ in 0..n {
        let name = header_name(&mut r, buf)?;
        let vl = r.varint()? as usize;
        let v = r.take(vl)?;
        at.push([name[0], name[1], offset(v), v.len() as u32]);
    }
    let kl = r.varint()? as usize;
    let key = r.take(kl)?;
    let value = r.rest();
    Ok(RecordRef::encoded(key, value, timestamp_ms, buf, at))
}

/// Decodes what [`encode_record`] wrote as views into `buf`, with the headers' places in
/// `at` (cleared first; reuse it across records: nothing is allocated per record then).
pub fn decode_record_ref<'a>(buf: &'a [u8], at: &'a mut Vec<[u32; 4]>) -> Result<RecordRef<'a>, String> {
    at.clear();
    let mut r = Reader::new(buf);
    let timestamp_ms = r.i64()?;
    let n = r.u16()?;
    let offset = |part: &[u8]| (part.as_ptr() as usize - buf.as_ptr() as usize) as u32;
    for _ in 0..n {
        let kl = r.u16()? as usize;
        let k = r.take(kl)?;
        if headers::standard(k).is_none() && std::str::from_utf8(k).is_err() {
            return Err("header name is not UTF-8".to_owned());
        }
        let v = r.bytes32()?;
        at.push([offset(k), k.len() as u32, offset(v), v.len() as u32]);
    }
    let key = r.bytes32()?;
    let value = r.bytes32()?;
    r.finish()?;
    Ok(RecordRef::encoded(key, value, timestamp_ms, buf, at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips_through_frame() {
        let r = Record {
            key: b"o-1".to_vec(),
            value: br#"{"type":"X"}"#.to_vec(),
            headers: vec![("ef-type".into(), b"X".to_vec()), ("ef-version".into(), b"3".to_vec())],
            timestamp_ms: 1_700_000_000_000,
        };
        let framed = framed(&encode_record(&r)).to_vec();
        assert_eq!(decode_record(unframe(&framed).unwrap()).unwrap(), r);
    }

    fn event_like() -> Record {
        Record {
            key: b"o-1".to_vec(),
            value: br#"{"type":"OrderPlaced"}"#.to_vec(),
            headers: vec![
                (headers::TYPE.into(), b"OrderPlaced".to_vec()),
                ("x-custom-tenant".into(), b"acme".to_vec()),
                (headers::EXPECTED_VERSION.into(), b"7".to_vec()),
                ("".into(), vec![]),
                (headers::CONTENT_TYPE.into(), vec![b'j'; 300]),
            ],
            timestamp_ms: -5,
        }
    }

    /// An event's headers as the processor writes them: the aggregate id is the key, and
    /// causation and correlation are the command id.
    fn event_with_ids() -> Record {
        let command = b"0193a5c2-7e41-7b8a-9c3d-5e6f7a8b9c0d".to_vec();
        Record {
            key: b"o-17".to_vec(),
            value: br#"{"type":"OrderPlaced","customer_id":"c-1"}"#.to_vec(),
            headers: vec![
                (headers::TYPE.into(), b"OrderPlaced".to_vec()),
                (headers::ID.into(), b"0193a5c2-7e41-7b8a-9c3d-000000000001".to_vec()),
                (headers::AGGREGATE_ID.into(), b"o-17".to_vec()),
                (headers::VERSION.into(), b"1".to_vec()),
                (headers::COMMAND_ID.into(), command.clone()),
                (headers::CORRELATION_ID.into(), command.clone()),
                (headers::CAUSATION_ID.into(), command),
                (headers::CONTENT_TYPE.into(), b"application/json".to_vec()),
                // A repeat of a repeat, and a one-byte repeat (written out).
                ("x-copy".into(), b"o-17".to_vec()),
                ("x-one".into(), b"1".to_vec()),
            ],
            timestamp_ms: 1_700_000_000_000,
        }
    }

    #[test]
    fn v3_records_round_trip_with_standard_and_other_names_and_repeats() {
        for r in [event_like(), event_with_ids(), Record::default()] {
            let bytes = framed_record(&r).to_vec();
            assert_eq!(bytes[4], FORMAT_RECORD_V3);
            assert_eq!(decode_framed_record(&bytes).unwrap(), r);
            // The borrowed decoding sees the same names and values.
            let mut at = Vec::new();
            let view = decode_framed_record_ref(&bytes, &mut at).unwrap();
            for (name, value) in &r.headers {
                assert_eq!(view.header(name), Some(value.as_slice()), "{name}");
            }
            assert_eq!(view.to_record(), r);
        }
    }

    #[test]
    fn v3_writes_a_repeated_value_once() {
        let r = event_with_ids();
        let bytes = framed_record(&r).len();
        let spelled_out = {
            // The same record with every repeat made distinct (same lengths).
            let mut distinct = r.clone();
            for (i, (_, v)) in distinct.headers.iter_mut().enumerate() {
                if v.len() > 1 {
                    v[0] = b'A' + i as u8;
                }
            }
            distinct.key[0] = b'z';
            framed_record(&distinct).len()
        };
        // Repeated: the aggregate id (4 bytes, and its length), the correlation and
        // causation ids (36 and their lengths) and `x-copy` (4): each now a 1-byte
        // reference instead.
        assert_eq!(
            spelled_out - bytes,
            4 + 36 + 36 + 4,
            "v3 {bytes} bytes, spelled out {spelled_out}"
        );
    }

    #[test]
    fn v3_repeats_only_values_within_the_window_and_reads_every_header_back() {
        let mut r = event_with_ids();
        let id = r.headers[1].1.clone();
        for n in 0..100 {
            // Copies of header 1 (in the window), and one value at headers 50 and 60:
            // past the window, the second is spelled out again.
            let value = if n == 40 || n == 50 { b"zz".to_vec() } else { id.clone() };
            r.headers.push((format!("x-{n}").into(), value));
        }
        let bytes = framed_record(&r).to_vec();
        assert_eq!(decode_framed_record(&bytes).unwrap(), r);
        // Per added header: code 0, the name's length and the name; then a 1-byte
        // reference for 98 of them and 3 bytes (length and `zz`) for the other two. The
        // count (110) still takes one byte.
        let names: usize = (0..100).map(|n| 2 + format!("x-{n}").len()).sum();
        let without = framed_record(&event_with_ids()).len();
        assert_eq!(bytes.len() - without, names + 98 + 2 * 3);
    }

    #[test]
    fn v3_is_smaller_than_v1_for_standard_headers() {
        let r = event_like();
        let v1 = framed(&encode_record(&r)).len();
        let v3 = framed_record(&r).len();
        // Per header, v1's name length (2 bytes) and name become a code (1 byte, and the
        // name after a length for other names) and the value length (4) a varint of twice
        // the length: 11, 3, 23, 3 and 15 bytes less. The count (2) becomes 1 byte, the key
        // length (4) 1, and the value length (4) goes: 8 bytes less. No value repeats
        // another.
        assert_eq!(v1 - v3, 11 + 3 + 23 + 3 + 15 + 8, "v1 {v1} bytes, v3 {v3}");
    }

    #[test]
    fn v3_truncation_bad_codes_and_bad_repeats_are_errors_not_panics() {
        let bytes = framed_record(&event_with_ids()).to_vec();
        let payload = &bytes[5..];
        // Every cut is an error except at the value's bytes, where a shorter value is
        // still a valid record: the value is the rest.
        let value_at = payload.len() - event_with_ids().value.len();
        for cut in 0..value_at {
            let mut at = Vec::new();
            assert!(decode_record_v3(&payload[..cut], &mut at).is_err(), "cut at {cut}");
        }
        // After the timestamp, the key (length 4) and the count: the first name code.
        let first_code = 8 + 1 + 4 + 1;
        let mut bad = payload.to_vec();
        bad[first_code] = headers::ALL.len() as u8 + 1;
        let err = decode_record_v3(&bad, &mut Vec::new()).unwrap_err();
        assert!(err.contains("unknown header name code"), "{err}");
        // The first header's value made a repeat of header 0, itself.
        let mut bad = payload.to_vec();
        bad[first_code + 1] = 1 << 1 | 1;
        let err = decode_record_v3(&bad, &mut Vec::new()).unwrap_err();
        assert!(err.contains("repeats header 0 not before it"), "{err}");
        let mut overlong = payload[..8].to_vec();
        overlong.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x7f]);
        let err = decode_record_v3(&overlong, &mut Vec::new()).unwrap_err();
        assert!(err.contains("overflows"), "{err}");
    }

    #[test]
    fn varints_round_trip_at_their_boundaries() {
        for n in [
            0usize,
            1,
            127,
            128,
            16_383,
            16_384,
            (1 << 21) - 1,
            1 << 21,
            u32::MAX as usize,
        ] {
            let mut buf = vec![0; varint_len(n)];
            let mut w = Writer { buf: &mut buf, at: 0 };
            w.varint(n);
            assert_eq!(w.at, varint_len(n), "{n}");
            let mut r = Reader::new(&buf);
            assert_eq!(r.varint().unwrap() as usize, n);
            r.finish().unwrap();
        }
    }

    #[test]
    fn any_flipped_bit_is_detected() {
        let framed = framed(b"hello world").to_vec();
        for i in 0..framed.len() {
            for bit in 0..8 {
                let mut bad = framed.clone();
                bad[i] ^= 1 << bit;
                assert!(unframe(&bad).is_err(), "flip of byte {i} bit {bit} went unnoticed");
            }
        }
        assert!(unframe(&framed[..3]).is_err());
        let record = framed_record(&event_like()).to_vec();
        for i in 0..record.len() {
            let mut bad = record.clone();
            bad[i] ^= 0x10;
            assert!(decode_framed_record(&bad).is_err(), "flip in byte {i} went unnoticed");
        }
        // A record's frame is not a value of the other tables.
        assert!(unframe(&record).unwrap_err().contains("unknown format version 3"));
    }

    #[test]
    fn truncated_payload_is_an_error_not_a_panic() {
        let r = Record {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            headers: vec![],
            timestamp_ms: 1,
        };
        let enc = encode_record(&r);
        for cut in 0..enc.len() {
            assert!(decode_record(&enc[..cut]).is_err(), "cut at {cut}");
        }
    }
}

/// Stored bytes written by format v1, kept as fixtures: a release that cannot read them
/// would strand users' data.
#[cfg(test)]
mod compatibility {
    use super::*;

    /// A framed v1 record: key `o-1`, value `{"type":"OrderConfirmed"}`, headers
    /// `ef-type: OrderConfirmed` and `ef-version: 2`, timestamp 1700000000000.
    /// Produced by an independent implementation of the documented layout (Python's
    /// `struct` and `zlib.crc32`), not by this crate.
    const RECORD_V1: &str = "46cac2af010068e5cf8b0100000200070065662d747970650e0000004f72646572436f6e6669726d65\
        640a0065662d76657273696f6e0100000032030000006f2d31190000007b2274797065223a224f72646572436f6e66\
        69726d6564227d";

    /// What every fixture holds: key `o-1`, value `{"type":"OrderConfirmed"}`, timestamp
    /// 1700000000000 and `ef-type: OrderConfirmed`.
    fn assert_order_confirmed(r: &Record) {
        assert_eq!(r.key, b"o-1");
        assert_eq!(r.value, br#"{"type":"OrderConfirmed"}"#);
        assert_eq!(r.timestamp_ms, 1_700_000_000_000);
        assert_eq!(r.header_str("ef-type"), Some("OrderConfirmed"));
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// A framed v2 record: as [`RECORD_V1`] with a third header, `x-tenant: acme`, a name
    /// outside the standard ones. Produced by Python's `struct` and `zlib.crc32` from the
    /// v2 layout documented at `encode_record_v3`.
    const RECORD_V2: &str = "f4e28df9020068e5cf8b01000003010e4f72646572436f6e6669726d65640401320008782d74656e616e\
        740461636d65036f2d317b2274797065223a224f72646572436f6e6669726d6564227d";

    /// A framed v3 record: as [`RECORD_V2`], with `ef-aggregate-id: o-1` (a repeat of the
    /// key), `ef-command-id: c-42` and `ef-causation-id: c-42` (a repeat of the header
    /// before) between `ef-type` and `x-tenant`, and no `ef-version`. Produced by Python's
    /// `struct` and `zlib.crc32` from the layout documented at `encode_record_v3`.
    const RECORD_V3: &str = "b2b5c62c030068e5cf8b010000036f2d3105011c4f72646572436f6e6669726d656403010508632d\
        343207070008782d74656e616e740861636d657b2274797065223a224f72646572436f6e6669726d6564227d";

    #[test]
    fn reads_v3_records() {
        let bytes = unhex(RECORD_V3);
        let r = decode_framed_record(&bytes).expect("v3 record");
        assert_order_confirmed(&r);
        let names: Vec<&str> = r.headers.iter().map(|(k, _)| k.as_ref()).collect();
        assert_eq!(
            names,
            [
                "ef-type",
                "ef-aggregate-id",
                "ef-command-id",
                "ef-causation-id",
                "x-tenant"
            ]
        );
        assert_eq!(r.header_str("ef-aggregate-id"), Some("o-1"));
        assert_eq!(r.header_str("ef-command-id"), Some("c-42"));
        assert_eq!(r.header_str("ef-causation-id"), Some("c-42"));
        assert_eq!(r.header_str("x-tenant"), Some("acme"));
        // And the current encoder still writes exactly these bytes.
        assert_eq!(framed_record(&r).to_vec(), bytes);
    }

    #[test]
    fn reads_v2_records() {
        let bytes = unhex(RECORD_V2);
        let r = decode_framed_record(&bytes).expect("v2 record");
        assert_order_confirmed(&r);
        assert_eq!(r.header_str("ef-version"), Some("2"));
        assert_eq!(r.header_str("x-tenant"), Some("acme"));
        // Written again, it is v3 and reads back the same.
        let again = framed_record(&r).to_vec();
        assert_eq!(again[4], FORMAT_RECORD_V3);
        assert_eq!(decode_framed_record(&again).expect("v3 record"), r);
        // Truncated v2 payloads are errors, not panics.
        let payload = &bytes[5..];
        let value_at = payload.len() - r.value.len();
        for cut in 0..value_at {
            assert!(
                decode_record_v2(&payload[..cut], &mut Vec::new()).is_err(),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn reads_v1_records() {
        let bytes = unhex(RECORD_V1);
        let r = decode_record(unframe(&bytes).expect("v1 frame")).expect("v1 record");
        // As the store reads its log: either format.
        assert_eq!(decode_framed_record(&bytes).expect("v1 record"), r);
        assert_order_confirmed(&r);
        assert_eq!(r.header_str("ef-version"), Some("2"));
        // And the current encoder still writes exactly these bytes.
        assert_eq!(framed(&encode_record(&r)).to_vec(), bytes);
    }
}
