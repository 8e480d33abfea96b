//! Typed reading of object members, with errors that name the field.
//!
//! Every protocol object is parsed through [`Fields`], so "what and where"
//! is reported the same way for every object and every host.

use super::base64url;
use super::json::{Object, Value, MAX_EMBEDDED_DEPTH};
use std::fmt;

/// What is wrong with one field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// A required member is absent.
    Missing,
    /// The member has the wrong JSON type.
    WrongType(&'static str),
    /// Not an integer written `0|[1-9][0-9]*` in [0, 2^53-1].
    NotProtocolInt,
    /// Not canonical unpadded base64url.
    BadBase64,
    /// Decoded length outside the allowed range.
    BadLength {
        /// Fewest bytes allowed.
        min: usize,
        /// Most bytes allowed.
        max: usize,
        /// Bytes the value decoded to.
        got: usize,
    },
    /// Any other constraint, stated in words.
    Invalid(String),
}

/// A field that violates the object constraints; `invalid_params` on the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted path from the params object, e.g. `envelope.created_at`.
    pub path: String,
    /// What is wrong there.
    pub problem: Problem,
}

impl FieldError {
    /// An error at `path`.
    pub fn new(path: impl Into<String>, problem: Problem) -> FieldError {
        FieldError {
            path: path.into(),
            problem,
        }
    }

    /// An error with a free-form description.
    pub fn invalid(path: impl Into<String>, why: impl Into<String>) -> FieldError {
        FieldError::new(path, Problem::Invalid(why.into()))
    }

    /// Prefixes the path with the enclosing member's name.
    pub fn within(mut self, parent: &str) -> FieldError {
        self.path = if self.path.is_empty() {
            parent.to_string()
        } else {
            format!("{parent}.{}", self.path)
        };
        self
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = if self.path.is_empty() {
            "params"
        } else {
            &self.path
        };
        match &self.problem {
            Problem::Missing => write!(f, "`{at}` is required"),
            Problem::WrongType(t) => write!(f, "`{at}` must be {t}"),
            Problem::NotProtocolInt => write!(
                f,
                "`{at}` must be an integer written 0|[1-9][0-9]* in [0, 2^53-1]"
            ),
            Problem::BadBase64 => write!(f, "`{at}` must be unpadded canonical base64url"),
            Problem::BadLength { min, max, got } if min == max => {
                write!(f, "`{at}` must decode to {min} bytes, not {got}")
            }
            Problem::BadLength { min, max, got } => {
                write!(f, "`{at}` must decode to {min} to {max} bytes, not {got}")
            }
            Problem::Invalid(why) => write!(f, "`{at}`: {why}"),
        }
    }
}

impl std::error::Error for FieldError {}

impl From<FieldError> for crate::Error {
    fn from(e: FieldError) -> crate::Error {
        crate::Error::new(crate::ErrorCode::InvalidParams, e.to_string())
    }
}

/// Reads typed members of one object.
#[derive(Clone, Copy)]
pub struct Fields<'a> {
    obj: &'a Object,
}

impl<'a> Fields<'a> {
    /// A reader over `obj`.
    pub fn new(obj: &'a Object) -> Fields<'a> {
        Fields { obj }
    }

    /// Refuses an object nested deeper than [`MAX_EMBEDDED_DEPTH`]: one the relay stores
    /// and later carries inside answers, which must stay within the depth limit.
    pub fn embeddable(&self) -> Result<(), FieldError> {
        if self.obj.depth() > MAX_EMBEDDED_DEPTH {
            return Err(FieldError::invalid(
                "",
                format!("nests deeper than {MAX_EMBEDDED_DEPTH} levels, more than any answer carrying it may"),
            ));
        }
        Ok(())
    }

    /// The raw member, if present.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj.get(key)
    }

    fn req(&self, key: &str) -> Result<&'a Value, FieldError> {
        self.obj
            .get(key)
            .ok_or_else(|| FieldError::new(key, Problem::Missing))
    }

    /// A required string.
    pub fn str(&self, key: &str) -> Result<&'a str, FieldError> {
        self.req(key)?
            .as_str()
            .ok_or_else(|| FieldError::new(key, Problem::WrongType("a string")))
    }

    /// An optional string.
    pub fn opt_str(&self, key: &str) -> Result<Option<&'a str>, FieldError> {
        self.get(key).map(|_| self.str(key)).transpose()
    }

    /// A required protocol integer.
    pub fn int(&self, key: &str) -> Result<u64, FieldError> {
        self.req(key)?
            .as_protocol_int()
            .ok_or_else(|| FieldError::new(key, Problem::NotProtocolInt))
    }

    /// An optional protocol integer.
    pub fn opt_int(&self, key: &str) -> Result<Option<u64>, FieldError> {
        self.get(key).map(|_| self.int(key)).transpose()
    }

    /// A required boolean.
    pub fn bool(&self, key: &str) -> Result<bool, FieldError> {
        match self.req(key)? {
            Value::Bool(b) => Ok(*b),
            _ => Err(FieldError::new(key, Problem::WrongType("a boolean"))),
        }
    }

    /// An optional boolean.
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, FieldError> {
        self.get(key).map(|_| self.bool(key)).transpose()
    }

    /// A required object.
    pub fn object(&self, key: &str) -> Result<&'a Object, FieldError> {
        self.req(key)?
            .as_object()
            .ok_or_else(|| FieldError::new(key, Problem::WrongType("an object")))
    }

    /// An optional object.
    pub fn opt_object(&self, key: &str) -> Result<Option<&'a Object>, FieldError> {
        self.get(key).map(|_| self.object(key)).transpose()
    }

    /// A required array.
    pub fn array(&self, key: &str) -> Result<&'a [Value], FieldError> {
        match self.req(key)? {
            Value::Array(a) => Ok(a),
            _ => Err(FieldError::new(key, Problem::WrongType("an array"))),
        }
    }

    /// Base64url bytes whose length lies in `min..=max`.
    pub fn bytes(&self, key: &str, min: usize, max: usize) -> Result<Vec<u8>, FieldError> {
        let s = self.str(key)?;
        let b = base64url::decode(s).ok_or_else(|| FieldError::new(key, Problem::BadBase64))?;
        if b.len() < min || b.len() > max {
            return Err(FieldError::new(
                key,
                Problem::BadLength {
                    min,
                    max,
                    got: b.len(),
                },
            ));
        }
        Ok(b)
    }

    /// Base64url bytes of exactly `N` bytes.
    pub fn fixed<const N: usize>(&self, key: &str) -> Result<[u8; N], FieldError> {
        let b = self.bytes(key, N, N)?;
        b.try_into()
            .map_err(|_| FieldError::new(key, Problem::BadBase64))
    }

    /// Checks that `type` is `expected`.
    pub fn expect_type(&self, expected: &str) -> Result<(), FieldError> {
        let t = self.str("type")?;
        if t != expected {
            return Err(FieldError::invalid(
                "type",
                format!("expected {expected:?}, got {t:?}"),
            ));
        }
        Ok(())
    }
}
