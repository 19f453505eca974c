//! Commands that die with their guard: the command `poolgate run` guards
//! and the node's health checks.
//!
//! A command runs in a process group of its own, so stopping it stops
//! everything it started (`bash -c 'sleep 300; …'` leaves no `sleep`
//! behind): SIGTERM to the group, SIGKILL after the grace.
//!
//! Signals reach a guard only while it lives; a guard killed outright
//! (SIGKILL, a crash) would leave its command running, unguarded. So the
//! command is not the guard's child but the child of a small keeper,
//! `poolgate guard-exec` (the same binary, see [`set_keeper`]), which asks
//! the kernel for SIGTERM when its parent dies (`PR_SET_PDEATHSIG`; the
//! guard spawns it from the thread that runs the guard's actors, which
//! lives as long as the process): when the guard is gone, however it
//! went, the keeper stops the command's group. The keeper runs in a
//! process group of its own (a signal to the guard's group does not reach
//! it), ignores SIGHUP, and also stops the group when told (SIGTERM,
//! SIGINT, SIGQUIT), and after the command exits
//! (what it left running goes with it), then exits with the command's
//! code (128 + signal if a signal ended it).
//!
//! The keeper itself can be killed or stopped (SIGKILL, SIGSTOP): the
//! guard learns the command's group from the keeper's child as soon as it
//! is started, and when the keeper exits without having stopped it, or
//! does not stop it when told, the guard stops that group itself. Either
//! way [`Guarded::wait`] and [`Guarded::stop`] return only once no process
//! of the group is left (or say which is).
//!
//! A guard can also be frozen (SIGSTOP, a hung runtime) while its keeper
//! runs on: then nobody could stop the command when its run ends. With a
//! watchdog ([`Guarded::spawn`]'s `watchdog`), the guard signals its
//! keeper several times a bound (SIGUSR1), and a keeper that hears
//! nothing for the bound stops the command's group and dies by SIGUSR2,
//! which the guard reads as "stopped for want of its guard"
//! ([`gave_up`]).
//!
//! Without a keeper (an embedder that did not call [`set_keeper`]), the
//! command still runs in its own group and is stopped as a group, but it
//! outlives a guard that is killed outright.

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// The hidden subcommand that runs the keeper.
pub const KEEPER_COMMAND: &str = "guard-exec";

static KEEPER: OnceLock<PathBuf> = OnceLock::new();

/// Names the binary whose `guard-exec` subcommand keeps commands (the
/// `poolgate` binary calls this with itself at start).
pub fn set_keeper(binary: PathBuf) {
    let _ = KEEPER.set(binary);
}

/// How the command's standard streams are set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Streams {
    /// Inherited from the guard (`poolgate run`).
    Inherit,
    /// No stdin or stdout; stderr piped to the guard (a health check).
    StderrOnly,
}

/// A command under guard.
#[derive(Debug)]
pub struct Guarded {
    child: tokio::process::Child,
    /// The keeper, while it may be running.
    keeper: Option<Pid>,
    /// The command's process group, when there is no keeper and it may
    /// still hold a process.
    group: Option<Pid>,
    /// With a keeper: the command's process group (the keeper's child),
    /// once seen.
    kept: Option<Pid>,
    grace: Duration,
    /// Signals the keeper while this guard runs (with a watchdog).
    beating: Option<tokio::task::JoinHandle<()>>,
}

/// How often the keeper's child is looked for until it is seen.
const LEARN_EVERY: Duration = Duration::from_millis(10);

impl Guarded {
    /// Starts `argv` in a process group of its own; `grace` is how long
    /// SIGTERM has before SIGKILL. With `watchdog` (and a keeper), the
    /// keeper stops the command when this guard gives no sign for that
    /// long (it is stopped, or its runtime hangs); the guard's runtime
    /// signals it five times per `watchdog`.
    pub fn spawn(
        argv: &[String],
        streams: Streams,
        grace: Duration,
        watchdog: Option<Duration>,
    ) -> std::io::Result<Guarded> {
        let Some((program, args)) = argv.split_first() else {
            return Err(std::io::Error::other("no command given"));
        };
        let keeper = KEEPER.get();
        let mut command = match keeper {
            Some(keeper) => {
                let mut command = tokio::process::Command::new(keeper);
                // A group of its own too: a signal to the guard's whole
                // group (a terminal's Ctrl-\, `kill -- -PGID`) must not
                // take the keeper with the guard.
                command
                    .process_group(0)
                    .arg(KEEPER_COMMAND)
                    .arg("--guard")
                    .arg(std::process::id().to_string())
                    .arg("--grace-ms")
                    .arg(grace.as_millis().to_string());
                if let Some(watchdog) = watchdog {
                    command
                        .arg("--watchdog-ms")
                        .arg(watchdog.as_millis().max(1).to_string());
                }
                command.arg("--").args(argv);
                command
            }
            None => {
                let mut command = tokio::process::Command::new(program);
                command.args(args).process_group(0);
                command
            }
        };
        if streams == Streams::StderrOnly {
            command
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
        }
        // A keeper killed outright could not stop the group: it is told
        // with SIGTERM instead (see `Drop`).
        let child = command.kill_on_drop(keeper.is_none()).spawn()?;
        let (group, keeper) = match keeper {
            Some(_) => (None, leader(&child)),
            None => (leader(&child), None),
        };
        let beating = match (keeper, watchdog) {
            (Some(keeper), Some(watchdog)) => Some(tokio::spawn(beat(keeper, watchdog / 5))),
            _ => None,
        };
        Ok(Guarded {
            child,
            keeper,
            group,
            kept: None,
            grace,
            beating,
        })
    }

    /// The command's stderr, if piped.
    pub fn stderr(&mut self) -> Option<tokio::process::ChildStderr> {
        self.child.stderr.take()
    }

    /// The keeper's exit status if it has exited already (its command
    /// done, or stopped by the keeper itself), without waiting.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits for the command to exit; what it left running in its group
    /// is stopped too. With a keeper, the keeper does that and exits with
    /// the command's code; a keeper that died otherwise (killed) leaves
    /// the group to this guard, which stops it before returning.
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        let status = loop {
            if self.keeper.is_some() && self.kept.is_none() {
                tokio::select! {
                    status = self.child.wait() => break status?,
                    _ = tokio::time::sleep(LEARN_EVERY) => self.learn_group(),
                }
            } else {
                break self.child.wait().await?;
            }
        };
        self.keeper = None;
        self.stop_beating();
        if let Some(group) = self.group.take() {
            stop_group(group, self.grace, &mut self.child, Some(status), false).await;
        }
        self.stop_kept().await.map_err(std::io::Error::other)?;
        Ok(status)
    }

    /// Stops the command and everything it started: SIGTERM to its group,
    /// SIGKILL after the grace. Returns once the group is gone; the
    /// processes of it left, if any could not be stopped (a process in
    /// uninterruptible I/O), as an error naming them.
    pub async fn stop(&mut self) -> Result<(), Leftover> {
        if let Some(group) = self.group.take() {
            stop_group(group, self.grace, &mut self.child, None, false).await;
            return left_in(group);
        }
        let Some(keeper) = self.keeper.take() else {
            return self.stop_kept().await;
        };
        self.stop_beating();
        self.learn_group();
        tell_keeper(keeper);
        // The keeper is done within the grace (SIGKILL included); one that
        // is not (hung) is killed, and the group with it.
        let bound = self.grace + Duration::from_secs(2);
        if tokio::time::timeout(bound, self.child.wait())
            .await
            .is_err()
        {
            let _ = killpg(keeper, Signal::SIGKILL);
            let _ = self.child.kill().await;
        }
        self.stop_kept().await
    }

    /// No more signs to the keeper (it is told to stop, or gone: its pid
    /// is not signalled once reaped).
    fn stop_beating(&mut self) {
        if let Some(beating) = self.beating.take() {
            beating.abort();
        }
    }

    /// Notes the command's group: the keeper's child (itself a group
    /// leader), once the keeper has started it.
    fn learn_group(&mut self) {
        if self.kept.is_some() {
            return;
        }
        if let Some(keeper) = self.keeper {
            self.kept = children_of(keeper.as_raw().unsigned_abs(), None)
                .into_iter()
                .next();
        }
    }

    /// Stops what is left of the command's group once its keeper is gone
    /// (normally nothing: the keeper stopped it).
    async fn stop_kept(&mut self) -> Result<(), Leftover> {
        let Some(group) = self.kept.take() else {
            return Ok(());
        };
        if killpg(group, None).is_err() {
            return Ok(());
        }
        tracing::warn!(
            group = group.as_raw(),
            "the command's keeper is gone and its group is not: stopping it"
        );
        let _ = killpg(group, Signal::SIGTERM);
        let deadline = tokio::time::Instant::now() + self.grace;
        while killpg(group, None).is_ok() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(GROUP_POLL).await;
        }
        let _ = killpg(group, Signal::SIGKILL);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        while killpg(group, None).is_ok() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(GROUP_POLL).await;
        }
        left_in(group)
    }
}

/// Processes of a command's group that could not be stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the command's process group {group} still holds a process after SIGKILL")]
pub struct Leftover {
    /// The group.
    pub group: i32,
}

/// Whether `group` is empty now.
fn left_in(group: Pid) -> Result<(), Leftover> {
    match killpg(group, None) {
        Err(_) => Ok(()),
        Ok(()) => Err(Leftover {
            group: group.as_raw(),
        }),
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // A keeper stops the group when told; without one, SIGKILL at
        // once (nothing can wait here).
        self.stop_beating();
        if let Some(keeper) = self.keeper.take() {
            tell_keeper(keeper);
        }
        if let Some(group) = self.group.take() {
            let _ = killpg(group, Signal::SIGKILL);
        }
    }
}

/// Signs of life to `keeper`, one every `every`, once it is ready for
/// them: it has started the command, so its handler is in place (before,
/// SIGUSR1 would end it).
async fn beat(keeper: Pid, every: Duration) {
    let every = every.max(Duration::from_millis(10));
    while children_of(keeper.as_raw().unsigned_abs(), None).is_empty() {
        tokio::time::sleep(LEARN_EVERY).await;
    }
    loop {
        let _ = nix::sys::signal::kill(keeper, Signal::SIGUSR1);
        tokio::time::sleep(every).await;
    }
}

/// The signal a keeper was killed by, if one was (not the watchdog's
/// SIGUSR2): a keeper otherwise exits with a code, the command's, since
/// it handles every signal that would end it.
pub fn killed_by(status: ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    status
        .signal()
        .filter(|signal| *signal != Signal::SIGUSR2 as i32)
}

/// Whether a keeper ended as one with a watchdog does when its guard gave
/// no sign for the bound: it stopped the command and died by SIGUSR2.
pub fn gave_up(status: ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.signal() == Some(Signal::SIGUSR2 as i32)
}

/// Tells the keeper to stop its command: SIGTERM, and SIGCONT so that a
/// keeper someone stopped (SIGSTOP, a debugger let go) does it now rather
/// than after the bound the guard gives it.
fn tell_keeper(keeper: Pid) {
    let _ = nix::sys::signal::kill(keeper, Signal::SIGTERM);
    let _ = nix::sys::signal::kill(keeper, Signal::SIGCONT);
}

/// A child's pid, as the group it leads.
fn leader(child: &tokio::process::Child) -> Option<Pid> {
    child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw)
}

/// How often a group being stopped is looked at.
const GROUP_POLL: Duration = Duration::from_millis(20);

/// SIGTERM to `group`, SIGKILL once `grace` has passed; returns once the
/// group is gone, its leader `child` (a child of this process, which
/// counts as in the group until reaped) reaped: its exit status, if it
/// was had (`status`: had already). With `adopted` (the keeper, a child
/// subreaper), the command's orphans are this process's children: they
/// are stopped too, whatever group or session they moved to (`setsid`),
/// and reaped, so none is left behind nor counted as alive as a zombie.
async fn stop_group(
    group: Pid,
    grace: Duration,
    child: &mut tokio::process::Child,
    mut status: Option<ExitStatus>,
    adopted: bool,
) -> Option<ExitStatus> {
    let leader = leader(child);
    let mut signal = Signal::SIGTERM;
    let _ = killpg(group, signal);
    // A stopped process of the group takes its SIGTERM now, not at the
    // SIGKILL a grace later.
    let _ = killpg(group, Signal::SIGCONT);
    let deadline = tokio::time::Instant::now() + grace;
    let mut killed = false;
    loop {
        let mut orphans = Vec::new();
        if adopted {
            if let Some(reaped) = reap(leader) {
                status.get_or_insert(reaped);
            }
            orphans = children_of(std::process::id(), leader);
            for orphan in &orphans {
                let _ = nix::sys::signal::kill(*orphan, signal);
            }
        }
        if status.is_none() {
            status = child.try_wait().ok().flatten();
        }
        if status.is_some() && killpg(group, None).is_err() && orphans.is_empty() {
            return status;
        }
        let now = tokio::time::Instant::now();
        if !killed && now >= deadline {
            signal = Signal::SIGKILL;
            let _ = killpg(group, signal);
            killed = true;
        } else if killed && now >= deadline + Duration::from_secs(1) {
            // SIGKILL cannot be refused; a process still listed is in the
            // kernel's hands (uninterruptible I/O). Nothing more to do.
            return status;
        }
        tokio::time::sleep(GROUP_POLL).await;
    }
}

/// Reaps every child of this process that has exited; the exit status of
/// `leader` if it was among them.
fn reap(leader: Option<Pid>) -> Option<ExitStatus> {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    use std::os::unix::process::ExitStatusExt;
    let mut found = None;
    loop {
        let raw = match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) => (pid, (code & 0xff) << 8),
            Ok(WaitStatus::Signaled(pid, signal, _)) => (pid, signal as i32),
            Ok(WaitStatus::StillAlive) | Err(_) => return found,
            Ok(_) => continue,
        };
        if Some(raw.0) == leader {
            found = Some(ExitStatus::from_raw(raw.1));
        }
    }
}

/// The children of process `parent` other than `leader` (for the keeper,
/// a child subreaper: the command's orphans).
fn children_of(parent: u32, leader: Option<Pid>) -> Vec<Pid> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| Some(Pid::from_raw(*pid)) != leader)
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // The parent is the second field after the command's name.
            let of = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
            of == Some(parent)
        })
        .map(Pid::from_raw)
        .collect()
}

/// Why the keeper could not start the command.
#[derive(Debug, thiserror::Error)]
pub enum KeeperError {
    /// The command could not be started.
    #[error("{program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// The keeper could not set itself up.
    #[error("keeper: {0}")]
    Io(#[from] std::io::Error),
}

/// The keeper (`poolgate guard-exec --guard PID --grace-ms MS
/// [--watchdog-ms MS] -- argv`): runs `argv` in a group of its own and
/// stops that group when the guard (`guard`, its parent) dies, when told
/// to, after the command exits, or (with `watchdog`) when the guard gave
/// no sign (SIGUSR1) for that long; then it dies by SIGUSR2 ([`gave_up`]).
/// Returns the command's exit code.
pub fn keep(
    guard: u32,
    grace: Duration,
    watchdog: Option<Duration>,
    argv: &[String],
) -> Result<i32, KeeperError> {
    let Some((program, args)) = argv.split_first() else {
        return Err(KeeperError::Spawn {
            program: String::new(),
            source: std::io::Error::other("no command given"),
        });
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        use tokio::signal::unix::{signal, SignalKind};
        // Handlers first, so the parent-death signal is caught, not fatal.
        let mut terminate = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut quit = signal(SignalKind::quit())?;
        // SIGHUP means "read your keys again" to every poolgate process
        // (`pkill -HUP poolgate`): caught, and ignored here.
        let mut hangup = signal(SignalKind::hangup())?;
        let mut signs = match watchdog {
            Some(_) => Some(signal(SignalKind::user_defined1())?),
            None => None,
        };
        nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(std::io::Error::from)?;
        // The command's orphans become this process's children, so none
        // escapes the stop by leaving the group (`setsid`).
        nix::sys::prctl::set_child_subreaper(true).map_err(std::io::Error::from)?;
        if nix::unistd::getppid().as_raw() != i32::try_from(guard).unwrap_or(-1) {
            // The guard died before the signal was asked for.
            return Ok(128 + Signal::SIGTERM as i32);
        }
        let mut child = tokio::process::Command::new(program)
            .args(args)
            .process_group(0)
            .spawn()
            .map_err(|source| KeeperError::Spawn {
                program: program.clone(),
                source,
            })?;
        let group = leader(&child);
        let bound = watchdog.unwrap_or(Duration::MAX / 4);
        // The guard's signs come five times per bound.
        let every = bound / 5;
        let silence = tokio::time::sleep(bound);
        tokio::pin!(silence);
        let mut gave_up = false;
        // Put off once since the last sign: this keeper was itself late.
        let mut waited = false;
        let status = loop {
            tokio::select! {
                // A sign waiting is taken before the silence is judged (a
                // keeper that was itself starved wakes to both).
                biased;
                Some(()) = async { signs.as_mut()?.recv().await }, if signs.is_some() => {
                    silence.as_mut().reset(tokio::time::Instant::now() + bound);
                    waited = false;
                }
                status = child.wait() => break Some(status?),
                _ = terminate.recv() => break None,
                _ = interrupt.recv() => break None,
                _ = quit.recv() => break None,
                _ = hangup.recv() => continue,
                _ = &mut silence, if watchdog.is_some() => {
                    let now = tokio::time::Instant::now();
                    if !waited && now.saturating_duration_since(silence.deadline()) > every {
                        // This keeper was stopped or starved itself: the
                        // signs sent meanwhile are read before it judges
                        // its guard on time it lost.
                        waited = true;
                        silence.as_mut().reset(now + every * 2);
                        continue;
                    }
                    eprintln!(
                        "poolgate guard-exec: no sign from its guard (pid {guard}) for {}: it is stopped or hung, so nothing would stop the command when its run ends; stopping it",
                        crate::config::in_words(bound)
                    );
                    gave_up = true;
                    break None;
                }
            }
        };
        // Exited, the guard gone, or told: the group goes (what the
        // command left running, or all of it).
        let status = match group {
            Some(group) => stop_group(group, grace, &mut child, status, true).await,
            None => status,
        };
        let status = match status {
            Some(status) => status,
            None => child.wait().await?,
        };
        if gave_up {
            // SIGUSR2 has its default action here (never handled): the
            // guard reads this death as the watchdog's.
            let _ = nix::sys::signal::raise(Signal::SIGUSR2);
        }
        Ok(code(status))
    })
}

/// A process's exit code as a shell gives it: 128 + signal when a signal
/// ended it.
pub fn code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}
