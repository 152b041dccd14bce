//! Remote functions: the [`RemoteFn`] trait, the [`crate::remote!`] macro that implements it
//! and registers the function at link time, and the table of registered functions.

use crate::archive::{self, Archive, ArchiveError, ChunkSource, Locate};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;

/// A boxed future, as remote functions return them.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// A function other ranks can call. Implemented by [`crate::remote!`]; the implementing type is
/// a unit struct named like the function, which is what `call` takes.
pub trait RemoteFn: Copy + Send + Sync + 'static {
    /// The arguments, as a tuple.
    type Args: Serialize + DeserializeOwned + Send + 'static;
    /// The result.
    type Output: Serialize + DeserializeOwned + Send + 'static;
    /// Unique name (module path + function name); its hash is the function's id on every rank.
    const NAME: &'static str;
    /// The function's id: the hash of [`RemoteFn::NAME`], computed at compile time.
    const ID: u64 = fn_id(Self::NAME);
    /// A plain (not `async`) function: when its call arrives eagerly and nothing is queued
    /// before it, it runs at once inside the message's handler and its result goes back as
    /// the AM reply (as HPX's direct actions), without a trip through the RPC queue. So it
    /// follows a handler's rules wherever it runs (in the handler or, for large or queued
    /// calls, from the progress hook): sending requests (calls, posts, AMs), collectives and
    /// `wait_all` fail with `Error::Misuse`, and its waits (a blocking get, say) deliver
    /// replies only. Write it as an `async fn` to communicate.
    const PLAIN: bool = false;
    /// Runs the function.
    fn run(args: Self::Args) -> BoxFuture<Self::Output>;
    /// Runs a plain (not `async`) function to completion at once, with no future; gives the
    /// arguments back for an `async` one.
    fn run_sync(args: Self::Args) -> Result<Self::Output, Self::Args> {
        Err(args)
    }
}

/// A value on its way out, type-erased: encodable, and kept alive until its chunks were read.
pub(crate) trait Outbound: Send {
    fn encode(&self, threshold: usize, pool: &dyn Locate, index: Vec<u8>) -> Result<Archive, ArchiveError>;
}

impl<T: Serialize + Send> Outbound for T {
    fn encode(&self, threshold: usize, pool: &dyn Locate, index: Vec<u8>) -> Result<Archive, ArchiveError> {
        archive::encode_into(self, threshold, pool, index)
    }
}

/// A value to send: encoded where it lies, and boxed only when it must outlive the send (a
/// rendezvous, whose chunks the target pulls later). Eager calls then allocate nothing for
/// their arguments.
pub(crate) trait Outgoing: Send + 'static {
    /// The value, to encode.
    fn value(&self) -> &dyn Outbound;
    /// The value on the heap, and the address range it occupied before (empty if it did not
    /// move): chunks pointing into that range must be encoded again.
    fn into_kept(self) -> (Box<dyn Outbound>, std::ops::Range<u64>);
}

impl Outgoing for Box<dyn Outbound> {
    fn value(&self) -> &dyn Outbound {
        &**self
    }
    fn into_kept(self) -> (Box<dyn Outbound>, std::ops::Range<u64>) {
        (self, 0..0)
    }
}

/// A value owned by the caller, not yet boxed.
pub(crate) struct Value<T>(pub T);

impl<T: Serialize + Send + 'static> Outgoing for Value<T> {
    fn value(&self) -> &dyn Outbound {
        &self.0
    }
    fn into_kept(self) -> (Box<dyn Outbound>, std::ops::Range<u64>) {
        let at = &self.0 as *const T as u64;
        (Box::new(self.0), at..at + std::mem::size_of::<T>() as u64)
    }
}

/// Hashes the u64 keys of weft's id maps (call ids count up; function ids are already FNV
/// hashes): one multiplication instead of SipHash on the call path.
#[derive(Clone, Copy, Default)]
pub(crate) struct IdHasher(u64);
impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A map keyed by ids.
pub(crate) type IdMap<V> = HashMap<u64, V, std::hash::BuildHasherDefault<IdHasher>>;

/// What a started remote function produces: its result, ready to encode.
pub(crate) type Running = BoxFuture<Box<dyn Outbound>>;

/// A remote function just started: finished already (plain functions) or running.
pub(crate) enum Started {
    Done(Box<dyn Outbound>),
    Running(Running),
}

/// One registered function.
#[derive(Clone, Copy)]
pub struct Registration {
    /// [`RemoteFn::NAME`].
    pub name: &'static str,
    /// The argument tuple's type, as the compiler names it.
    pub args: &'static str,
    /// The result's type.
    pub output: &'static str,
    /// [`RemoteFn::PLAIN`].
    pub plain: bool,
    pub(crate) start: fn(&[u8], &dyn ChunkSource) -> Result<Started, ArchiveError>,
}

impl Registration {
    /// The registration of `F` (what [`crate::remote!`] puts in [`REMOTE_FNS`]).
    pub fn of<F: RemoteFn>() -> Registration {
        Registration {
            name: F::NAME,
            args: std::any::type_name::<F::Args>(),
            output: std::any::type_name::<F::Output>(),
            plain: F::PLAIN,
            start: start::<F>,
        }
    }
}

fn start<F: RemoteFn>(index: &[u8], chunks: &dyn ChunkSource) -> Result<Started, ArchiveError> {
    let args: F::Args = archive::decode(index, chunks)?;
    Ok(match F::run_sync(args) {
        Ok(out) => Started::Done(Box::new(out)),
        Err(args) => {
            let fut = F::run(args);
            Started::Running(Box::pin(async move { Box::new(fut.await) as Box<dyn Outbound> }))
        }
    })
}

/// Every function declared with [`crate::remote!`] in the program, collected at link time.
#[linkme::distributed_slice]
pub static REMOTE_FNS: [fn() -> Registration];

/// The id of a function name: 64-bit FNV-1a (stable across builds and ranks).
pub const fn fn_id(name: &str) -> u64 {
    let b = name.as_bytes();
    let mut h: u64 = 0xcbf29ce484222325;
    let mut i = 0;
    while i < b.len() {
        h ^= b[i] as u64;
        h = h.wrapping_mul(0x100000001b3);
        i += 1;
    }
    h
}

/// The table of this program's remote functions by id; two names with one id are an error.
pub(crate) fn table() -> Result<IdMap<Registration>, String> {
    let mut t: IdMap<Registration> = IdMap::default();
    for reg in REMOTE_FNS.iter().map(|f| f()) {
        if let Some(old) = t.insert(fn_id(reg.name), reg) {
            if old.name != reg.name {
                return Err(format!("remote functions {:?} and {:?} hash to one id", old.name, reg.name));
            }
        }
    }
    Ok(t)
}

/// This program's functions with their types, one per line, sorted: what start-up compares
/// across ranks (same name, same types, or the job does not start).
pub(crate) fn signatures(t: &IdMap<Registration>) -> String {
    let mut lines: Vec<String> =
        t.values().map(|r| format!("{}{} -> {}", r.name, r.args, r.output)).collect();
    lines.sort_unstable();
    lines.join("\n")
}

/// Compares two [`signatures`] tables; the error says what only one side has.
pub(crate) fn compare_signatures(mine: &str, theirs: &[u8]) -> Result<(), String> {
    if mine.as_bytes() == theirs {
        return Ok(());
    }
    let theirs = String::from_utf8_lossy(theirs);
    let t: Vec<&str> = theirs.split('\n').filter(|s| !s.is_empty()).collect();
    let m: Vec<&str> = mine.split('\n').filter(|s| !s.is_empty()).collect();
    let only_mine: Vec<&&str> = m.iter().filter(|n| !t.contains(n)).collect();
    let only_theirs: Vec<&&str> = t.iter().filter(|n| !m.contains(n)).collect();
    Err(format!("only here: {only_mine:?}; only there: {only_theirs:?}"))
}

/// Declares functions other ranks can call, registered on every rank at link time with ids
/// derived from their path (no numbering). Each becomes a unit struct of the same name that
/// implements [`RemoteFn`]; pass it to `call`/`post`. A plain `fn` may run inside the handler
/// of its call (quick, no requests, collectives or `wait_all` inside: see
/// [`RemoteFn::PLAIN`]); an `async fn` runs from the progress hook and may communicate.
///
/// ```
/// # mod weft { pub use weft_runtime::*; pub use weft_rpc::*; }
/// weft::remote! {
///     /// Adds two numbers on whichever rank is asked.
///     pub fn add(a: u64, b: u64) -> u64 { a + b }
/// }
/// weft::remote! {
///     pub async fn total(v: weft::SerializeBuffer<f64>) -> f64 { v.iter().sum() }
/// }
/// ```
#[macro_export]
macro_rules! remote {
    ($(#[$m:meta])* $vis:vis async fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $(-> $ret:ty)? $body:block) => {
        $crate::remote!(@item [$(#[$m])*] $vis $name ($($arg : $ty),*) ($($ret)?)
            { ::std::boxed::Box::pin(async move $body) }
            { ::std::result::Result::Err(($($arg,)*)) } false);
    };
    ($(#[$m:meta])* $vis:vis fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $(-> $ret:ty)? $body:block) => {
        $crate::remote!(@item [$(#[$m])*] $vis $name ($($arg : $ty),*) ($($ret)?)
            {
                let f = move || -> $crate::remote!(@ret $($ret)?) { $body };
                ::std::boxed::Box::pin(async move { f() })
            }
            { ::std::result::Result::Ok((move || -> $crate::remote!(@ret $($ret)?) { $body })()) } true);
    };
    (@ret) => { () };
    (@ret $ret:ty) => { $ret };
    (@item [$($m:tt)*] $vis:vis $name:ident ($($arg:ident : $ty:ty),*) ($($ret:ty)?) $run:block $sync:block $plain:literal) => {
        $($m)*
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug)]
        $vis struct $name;
        impl $crate::RemoteFn for $name {
            type Args = ($($ty,)*);
            type Output = $crate::remote!(@ret $($ret)?);
            const NAME: &'static str = concat!(module_path!(), "::", stringify!($name));
            const PLAIN: bool = $plain;
            #[allow(unused_parens)]
            fn run(args: Self::Args) -> $crate::BoxFuture<Self::Output> {
                let ($($arg,)*) = args;
                $run
            }
            #[allow(unused_parens)]
            fn run_sync(args: Self::Args) -> ::std::result::Result<Self::Output, Self::Args> {
                let ($($arg,)*) = args;
                $sync
            }
        }
        const _: () = {
            #[$crate::__linkme::distributed_slice($crate::REMOTE_FNS)]
            #[linkme(crate = $crate::__linkme)]
            static REGISTER: fn() -> $crate::Registration = $crate::Registration::of::<$name>;
        };
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_catch_a_type_change() {
        let mine = "app::f(u64,) -> u64\napp::g() -> ()";
        assert!(compare_signatures(mine, mine.as_bytes()).is_ok());
        let theirs = "app::f(alloc::string::String,) -> u64\napp::g() -> ()";
        let e = compare_signatures(mine, theirs.as_bytes()).unwrap_err();
        assert!(e.contains("app::f(u64,) -> u64") && e.contains("app::f(alloc::string::String,)"), "{e}");
        assert!(!e.contains("app::g"), "{e}");
    }

    #[test]
    fn this_programs_table_has_types() {
        let t = table().expect("no id collisions");
        let s = signatures(&t);
        assert_eq!(s.lines().count(), t.len());
    }
}
