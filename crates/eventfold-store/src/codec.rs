//! Byte formats of stored values. Integers have explicit widths and are big-endian in
//! keys (so they sort) and little-endian in values. Every value is framed as
//! `crc32(u32 LE) | format(u8) | payload`, the CRC covering format and payload.

use eventfold_core::envelope::headers;
use eventfold_core::{Record, RecordRef};
use fjall::Slice;

/// Current frame format.
pub const FORMAT_V1: u8 = 1;

/// `payload` framed with format byte and checksum, as a store value (see [`slice_of`]).
pub(crate) fn framed(payload: &[u8]) -> Slice {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&[FORMAT_V1]);
    crc.update(payload);
    slice_of(&[&crc.finalize().to_le_bytes(), &[FORMAT_V1], payload])
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

/// Checks a frame and returns its payload.
pub fn unframe(bytes: &[u8]) -> Result<&[u8], String> {
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
    if bytes[4] != FORMAT_V1 {
        return Err(format!("unknown format version {}", bytes[4]));
    }
    Ok(&bytes[5..])
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

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn reads_v1_records() {
        let bytes = unhex(RECORD_V1);
        let r = decode_record(unframe(&bytes).expect("v1 frame")).expect("v1 record");
        assert_eq!(r.key, b"o-1");
        assert_eq!(r.value, br#"{"type":"OrderConfirmed"}"#);
        assert_eq!(r.timestamp_ms, 1_700_000_000_000);
        assert_eq!(r.header_str("ef-type"), Some("OrderConfirmed"));
        assert_eq!(r.header_str("ef-version"), Some("2"));
        // And the current encoder still writes exactly these bytes.
        assert_eq!(framed(&encode_record(&r)).to_vec(), bytes);
    }
}
