//! Small shared vocabulary: ranks, element types, reduce ops, devices and
//! operation kinds. Numeric values of `ReduceOp` and `OpKind` are part of the
//! C ABI (`csrc-shim/rustccl.h`) and must not change.
#![forbid(unsafe_code)]

use std::fmt;

/// A rank within one communicator (0-based, < size).
pub type Rank = usize;

/// Element type of a tensor, as far as rustccl cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F64,
    F16,
    BF16,
    U8,
    I8,
    I16,
    I32,
    I64,
    Bool,
    /// Any other type (complex, float8, uint32, ...): moved as bytes by data
    /// movement collectives, refused by reductions. `bits` is the element size.
    Other {
        code: u8,
        bits: u16,
    },
}

impl DType {
    /// Maps DLPack's (code, bits, lanes).
    pub fn from_dlpack(code: u8, bits: u8, lanes: u16) -> Option<DType> {
        use dlpack_rs::ffi::DLDataTypeCode as C;
        if lanes != 1 {
            return None;
        }
        let code32 = code as u32;
        Some(match (code32, bits) {
            (C::kDLFloat, 32) => DType::F32,
            (C::kDLFloat, 64) => DType::F64,
            (C::kDLFloat, 16) => DType::F16,
            (C::kDLBfloat, 16) => DType::BF16,
            (C::kDLUInt, 8) => DType::U8,
            (C::kDLInt, 8) => DType::I8,
            (C::kDLInt, 16) => DType::I16,
            (C::kDLInt, 32) => DType::I32,
            (C::kDLInt, 64) => DType::I64,
            (C::kDLBool, 8) => DType::Bool,
            (_, b) if b >= 8 && b % 8 == 0 => DType::Other { code, bits: b as u16 },
            _ => return None,
        })
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 | DType::I16 => 2,
            DType::U8 | DType::I8 | DType::Bool => 1,
            DType::Other { bits, .. } => bits as usize / 8,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    pub fn name(self) -> String {
        match self {
            DType::F32 => "float32".into(),
            DType::F64 => "float64".into(),
            DType::F16 => "float16".into(),
            DType::BF16 => "bfloat16".into(),
            DType::U8 => "uint8".into(),
            DType::I8 => "int8".into(),
            DType::I16 => "int16".into(),
            DType::I32 => "int32".into(),
            DType::I64 => "int64".into(),
            DType::Bool => "bool".into(),
            DType::Other { code, bits } => {
                use dlpack_rs::ffi::DLDataTypeCode as C;
                match code as u32 {
                    C::kDLComplex => format!("complex{bits}"),
                    C::kDLUInt => format!("uint{bits}"),
                    C::kDLInt => format!("int{bits}"),
                    C::kDLFloat => format!("float{bits}"),
                    C::kDLFloat8_e3m4 => "float8_e3m4".into(),
                    C::kDLFloat8_e4m3 => "float8_e4m3".into(),
                    C::kDLFloat8_e4m3b11fnuz => "float8_e4m3b11fnuz".into(),
                    C::kDLFloat8_e4m3fn => "float8_e4m3fn".into(),
                    C::kDLFloat8_e4m3fnuz => "float8_e4m3fnuz".into(),
                    C::kDLFloat8_e5m2 => "float8_e5m2".into(),
                    C::kDLFloat8_e5m2fnuz => "float8_e5m2fnuz".into(),
                    C::kDLFloat8_e8m0fnu => "float8_e8m0fnu".into(),
                    _ => format!("dlpack-type-{code}/{bits}bit"),
                }
            }
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// Reduction operators. Values match `c10d::ReduceOp::RedOpType`.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum = 0,
    Avg = 1,
    Product = 2,
    Min = 3,
    Max = 4,
    BAnd = 5,
    BOr = 6,
    BXor = 7,
}

impl ReduceOp {
    pub fn from_i32(v: i32) -> Option<ReduceOp> {
        Some(match v {
            0 => ReduceOp::Sum,
            1 => ReduceOp::Avg,
            2 => ReduceOp::Product,
            3 => ReduceOp::Min,
            4 => ReduceOp::Max,
            5 => ReduceOp::BAnd,
            6 => ReduceOp::BOr,
            7 => ReduceOp::BXor,
            _ => return None,
        })
    }

    pub fn from_name(s: &str) -> Option<ReduceOp> {
        use ReduceOp::*;
        // Compared without a lowercased copy: this runs on every call.
        const NAMES: [(&str, ReduceOp); 10] = [
            ("sum", Sum),
            ("avg", Avg),
            ("mean", Avg),
            ("product", Product),
            ("prod", Product),
            ("min", Min),
            ("max", Max),
            ("band", BAnd),
            ("bor", BOr),
            ("bxor", BXor),
        ];
        NAMES.iter().find(|(name, _)| name.eq_ignore_ascii_case(s)).map(|&(_, op)| op)
    }

    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "SUM",
            ReduceOp::Avg => "AVG",
            ReduceOp::Product => "PRODUCT",
            ReduceOp::Min => "MIN",
            ReduceOp::Max => "MAX",
            ReduceOp::BAnd => "BAND",
            ReduceOp::BOr => "BOR",
            ReduceOp::BXor => "BXOR",
        }
    }
}

/// Where a tensor lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    Cpu,
    Cuda(i32),
    Other { kind: u32, index: i32 },
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
            Device::Other { kind, index } => write!(f, "dlpack-device-{kind}:{index}"),
        }
    }
}

/// The operations a communicator runs. Values are part of the C ABI.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    AllReduce = 0,
    Broadcast = 1,
    Reduce = 2,
    AllGather = 3,
    ReduceScatter = 4,
    AllToAll = 5,
    Gather = 6,
    Scatter = 7,
    Send = 8,
    Recv = 9,
    Barrier = 10,
}

impl OpKind {
    /// How many kinds there are (the values run from 0 to `COUNT - 1`).
    pub const COUNT: usize = 11;

    pub fn from_i32(v: i32) -> Option<OpKind> {
        use OpKind::*;
        Some(match v {
            0 => AllReduce,
            1 => Broadcast,
            2 => Reduce,
            3 => AllGather,
            4 => ReduceScatter,
            5 => AllToAll,
            6 => Gather,
            7 => Scatter,
            8 => Send,
            9 => Recv,
            10 => Barrier,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        use OpKind::*;
        match self {
            AllReduce => "all_reduce",
            Broadcast => "broadcast",
            Reduce => "reduce",
            AllGather => "all_gather",
            ReduceScatter => "reduce_scatter",
            AllToAll => "all_to_all",
            Gather => "gather",
            Scatter => "scatter",
            Send => "send",
            Recv => "recv",
            Barrier => "barrier",
        }
    }

    pub fn from_name(name: &str) -> Option<OpKind> {
        use OpKind::*;
        [AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, AllToAll, Gather, Scatter, Send, Recv, Barrier]
            .into_iter()
            .find(|k| k.name() == name)
    }

    pub fn is_p2p(self) -> bool {
        matches!(self, OpKind::Send | OpKind::Recv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dlpack_codes_map_to_dtypes() {
        use dlpack_rs::ffi::DLDataTypeCode as C;
        assert_eq!(DType::from_dlpack(C::kDLFloat as u8, 32, 1), Some(DType::F32));
        assert_eq!(DType::from_dlpack(C::kDLBfloat as u8, 16, 1), Some(DType::BF16));
        assert_eq!(DType::from_dlpack(C::kDLBool as u8, 8, 1), Some(DType::Bool));
        assert_eq!(DType::from_dlpack(C::kDLFloat as u8, 32, 4), None);
        let c64 = DType::from_dlpack(C::kDLComplex as u8, 64, 1).unwrap();
        assert_eq!(c64.size(), 8);
        assert_eq!(c64.name(), "complex64");
    }

    #[test]
    fn op_kinds_number_from_zero_to_count() {
        for v in 0..OpKind::COUNT as i32 {
            assert_eq!(OpKind::from_i32(v).unwrap() as i32, v);
        }
        assert_eq!(OpKind::from_i32(OpKind::COUNT as i32), None);
    }

    #[test]
    fn reduce_op_numbering_matches_c10d() {
        for v in 0..8 {
            assert_eq!(ReduceOp::from_i32(v).unwrap() as i32, v);
        }
        assert_eq!(ReduceOp::from_i32(8), None); // PREMUL_SUM is not supported
    }
}
