//! Signals of the launcher: interrupts it turns into an orderly stop, a rank's request to end
//! the job with a status, and signal names.

use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Name of a signal ("SIGKILL"), or its number.
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}

static INTERRUPTED: AtomicU32 = AtomicU32::new(0);
static INTERRUPTS: AtomicU32 = AtomicU32::new(0);

extern "C" fn on_interrupt(sig: libc::c_int) {
    INTERRUPTED.store(sig as u32, Ordering::SeqCst);
    INTERRUPTS.fetch_add(1, Ordering::SeqCst);
}

/// A rank's request to end the job: its process id (high half) and status + 1 (0: none),
/// in one word so that the two always belong together.
static END_ASKED: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_end_asked(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo_t to an SA_SIGINFO handler; a signal sent with
    // sigqueue carries the sender's pid and value (`kill` leaves the value 0: status 0).
    let (pid, value) = unsafe { ((*info).si_pid(), (*info).si_value().sival_ptr as usize) };
    END_ASKED.store((pid as u32 as u64) << 32 | ((value & 0xff) as u64 + 1), Ordering::SeqCst);
}

/// The status a rank asked the job to end with ([`crate::boot::ask_launcher_to_end_job`]),
/// and the process that asked; taken (a later call says `None` until another request).
pub fn end_asked() -> Option<(i32, u32)> {
    match END_ASKED.swap(0, Ordering::SeqCst) {
        0 => None,
        w => Some((w as u32 as i32 - 1, (w >> 32) as u32)),
    }
}

/// Most exit handlers [`at_exit`] keeps.
const EXIT_HANDLERS: usize = 16;
/// The handlers [`at_exit`] registered: the function, and the process that registered it.
static EXIT_FNS: [AtomicUsize; EXIT_HANDLERS] = [const { AtomicUsize::new(0) }; EXIT_HANDLERS];
static EXIT_PIDS: [AtomicI32; EXIT_HANDLERS] = [const { AtomicI32::new(0) }; EXIT_HANDLERS];
static EXIT_COUNT: AtomicUsize = AtomicUsize::new(0);

/// Runs, newest first, the handlers that this very process registered: a child of `fork`
/// inherits the list, and its `exit` must change nothing of its parent's job.
extern "C" fn run_exit_handlers() {
    // SAFETY: getpid has no preconditions; it asks the kernel (not a cached value).
    let me = unsafe { libc::getpid() };
    let n = EXIT_COUNT.load(Ordering::Acquire).min(EXIT_HANDLERS);
    for i in (0..n).rev() {
        if EXIT_PIDS[i].load(Ordering::Acquire) != me {
            continue;
        }
        let f = EXIT_FNS[i].swap(0, Ordering::AcqRel);
        if f != 0 {
            // SAFETY: only `at_exit` stores here, and it stores an `extern "C" fn()`.
            let f: extern "C" fn() = unsafe { std::mem::transmute::<usize, extern "C" fn()>(f) };
            f();
        }
    }
}

/// Runs `f` when the process that calls this exits through `exit` (a return from `main`
/// included; not when a signal or `_exit` ends it); false if it could not be registered (at
/// most 16 are kept). A child of `fork` that exits runs none of its parent's handlers.
///
/// ```
/// extern "C" fn bye() {
///     eprintln!("leaving");
/// }
/// assert!(weft_fabric::signals::at_exit(bye));
/// ```
pub fn at_exit(f: extern "C" fn()) -> bool {
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    // SAFETY: atexit keeps a pointer to a function, which lives as long as the program.
    if !*REGISTERED.get_or_init(|| unsafe { libc::atexit(run_exit_handlers) == 0 }) {
        return false;
    }
    let i = EXIT_COUNT.fetch_add(1, Ordering::AcqRel);
    if i >= EXIT_HANDLERS {
        return false;
    }
    // SAFETY: getpid has no preconditions.
    EXIT_PIDS[i].store(unsafe { libc::getpid() }, Ordering::Release);
    EXIT_FNS[i].store(f as usize, Ordering::Release);
    true
}

/// Runs `f` in the child right after each `fork` of this process (it must only store to
/// atomics or make system calls: the child has one thread, and locks may be held by threads
/// that are not there); false if it could not be registered.
///
/// ```
/// extern "C" fn forked() {}
/// assert!(weft_fabric::signals::at_fork_child(forked));
/// ```
pub fn at_fork_child(f: extern "C" fn()) -> bool {
    // SAFETY: pthread_atfork keeps a pointer to a function, which lives as long as the program.
    unsafe { libc::pthread_atfork(None, None, Some(f)) == 0 }
}

/// Sends `pid` SIGUSR1 carrying `status` (0-255), which [`catch_interrupts`] turns into
/// [`end_asked`]; false if the signal could not be sent.
pub fn ask_to_end(pid: u32, status: i32) -> bool {
    let value = libc::sigval { sival_ptr: (status & 0xff) as usize as *mut libc::c_void };
    // SAFETY: sigqueue only sends a signal with a value; it touches no memory of this process.
    unsafe { libc::sigqueue(pid as libc::pid_t, libc::SIGUSR1, value) == 0 }
}

/// Routes SIGINT, SIGTERM and SIGHUP to a flag read by [`interrupted`] instead of ending the
/// process, so that a launcher can stop its ranks and clean up; SIGUSR1 to [`end_asked`].
pub fn catch_interrupts() {
    // SAFETY: a zeroed sigaction with an SA_SIGINFO handler that only stores to atomics
    // (async-signal-safe) and an empty mask; the old action is not asked for.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_end_asked as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
            as libc::sighandler_t;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut act.sa_mask);
        libc::sigaction(libc::SIGUSR1, &act, std::ptr::null_mut());
    }
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to atomics, which is async-signal-safe.
        unsafe { libc::signal(sig, on_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    }
}

/// The last signal caught by [`catch_interrupts`], if any.
pub fn interrupted() -> Option<i32> {
    match INTERRUPTED.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s as i32),
    }
}

/// How many signals [`catch_interrupts`] caught (a second one asks for haste).
pub fn interrupts() -> u32 {
    INTERRUPTS.load(Ordering::SeqCst)
}

/// Asynchronous signals (all but those a fault raises: SIGSEGV, SIGBUS, SIGFPE, SIGILL,
/// SIGTRAP, SIGSYS) blocked in the calling thread until this is dropped; the kernel holds
/// them pending, and they are delivered once the old mask is back.
#[must_use = "the signals are blocked only while this lives"]
pub struct AsyncSignalsBlocked {
    old: libc::sigset_t,
}

/// Blocks asynchronous signals in this thread (see [`AsyncSignalsBlocked`]).
///
/// ```
/// let blocked = weft_fabric::signals::block_async_signals();
/// // No signal handler of the program runs on this thread here...
/// drop(blocked); // ...and any that came meanwhile runs now.
/// ```
pub fn block_async_signals() -> AsyncSignalsBlocked {
    // SAFETY: sigset_t is plain data that sigfillset/sigdelset initialise; pthread_sigmask
    // only changes this thread's mask and writes the old one into `old`.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        for sig in [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGTRAP, libc::SIGSYS] {
            libc::sigdelset(&mut set, sig);
        }
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        AsyncSignalsBlocked { old }
    }
}

impl Drop for AsyncSignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: puts back the mask this thread had; pending signals are delivered then.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut()) };
    }
}

/// Starts a thread of weft's own with asynchronous signals blocked for its whole life, so
/// that the program's signal handlers never run on it (they run on the program's threads,
/// and not while weft moves the program's data, see [`crate::Fabric::adopt_program_data`]).
///
/// ```
/// let t = weft_fabric::signals::spawn_quiet(std::thread::Builder::new(), || 7).unwrap();
/// assert_eq!(t.join().unwrap(), 7);
/// ```
pub fn spawn_quiet<F, T>(builder: std::thread::Builder, f: F) -> std::io::Result<std::thread::JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    // The new thread inherits the mask of the one that creates it.
    let _blocked = block_async_signals();
    builder.spawn(f)
}
