//! The live view on a terminal, like `top`: the alternate screen in raw mode, one frame drawn
//! over the last every interval, `q`, Esc or Ctrl-C to quit, and the terminal given back as it
//! was however the view ends (a quit, a signal, an error, a panic).
//!
//! Keys are read on a thread of their own (crossterm's reads block), which hands them to the
//! refresh loop over a channel. A read that fails once the view is up does not end it: the
//! frame keeps the last good read and says what failed, and the next refresh tries again.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossterm::event::{Event, KeyCode, KeyEventKind, KeyModifiers};
use crossterm::style::Print;
use crossterm::terminal::{self, ClearType};
use crossterm::{cursor, event, execute, queue};
use tokio::sync::mpsc;

use super::{frame, rates, Reader};

/// The terminal's width and height; 80x24 when it cannot tell.
pub fn size() -> (usize, usize) {
    terminal::size()
        .map(|(w, h)| (usize::from(w), usize::from(h)))
        .unwrap_or((80, 24))
}

/// Refreshes a frame every `interval` until the user quits.
pub async fn live(reader: &Reader, interval: Duration) -> anyhow::Result<()> {
    // Read once before taking the screen: a gateway that is not there is one line on stderr.
    let mut last = reader.read().await?;
    let mut view = rates::view(&reader.url, None, &last);
    let mut problem: Option<String> = None;
    let screen = Screen::enter()?;
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, mut input) = mpsc::unbounded_channel();
    let keys = {
        let stop = stop.clone();
        std::thread::spawn(move || read_keys(&tx, &stop))
    };
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut next = tokio::time::Instant::now() + interval;
    let ended = loop {
        if let Err(e) = draw(&view, problem.as_deref()) {
            break Err(e.into());
        }
        tokio::select! {
            () = tokio::time::sleep_until(next) => {
                next = (next + interval).max(tokio::time::Instant::now());
                tokio::select! {
                    read = reader.read() => match read {
                        Ok(now) => {
                            view = rates::view(&reader.url, Some(&last), &now);
                            last = now;
                            problem = None;
                        }
                        Err(e) => problem = Some(format!("{e:#}")),
                    },
                    key = input.recv() => if !matches!(key, Some(Key::Redraw)) { break Ok(()) },
                }
            }
            key = input.recv() => if !matches!(key, Some(Key::Redraw)) { break Ok(()) },
            _ = tokio::signal::ctrl_c() => break Ok(()),
            _ = terminate.recv() => break Ok(()),
        }
    };
    stop.store(true, Ordering::Relaxed);
    let _ = keys.join();
    drop(screen);
    ended
}

/// What a key (or the terminal) asks of the view.
enum Key {
    Quit,
    Redraw,
}

/// Reads keys until `stop`, telling the view to quit on `q`, Esc or Ctrl-C (raw mode turns
/// Ctrl-C into a key, not a signal) and to redraw when the terminal is resized.
fn read_keys(tx: &mpsc::UnboundedSender<Key>, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let key = match event::poll(Duration::from_millis(100)) {
            Ok(false) => continue,
            Ok(true) => match event::read() {
                Ok(Event::Key(k)) if k.kind != KeyEventKind::Release => match k.code {
                    KeyCode::Char('q' | 'Q') | KeyCode::Esc => Key::Quit,
                    KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => Key::Quit,
                    _ => continue,
                },
                Ok(Event::Resize(..)) => Key::Redraw,
                Ok(_) => continue,
                Err(_) => Key::Quit,
            },
            // No terminal to read keys from any more.
            Err(_) => Key::Quit,
        };
        let quit = matches!(key, Key::Quit);
        if tx.send(key).is_err() || quit {
            return;
        }
    }
}

/// Draws `view` over the last frame, a line at a time, and a footer on the last row.
fn draw(view: &rates::View, problem: Option<&str>) -> std::io::Result<()> {
    let (width, height) = size();
    let lines = frame::render(view, width, Some(height.saturating_sub(1)));
    let footer = match problem {
        Some(p) => format!("last read failed, showing the one before: {p}"),
        None => "q: quit".to_owned(),
    };
    let mut out = std::io::stdout().lock();
    for (row, line) in lines.iter().enumerate() {
        queue!(
            out,
            cursor::MoveTo(0, row as u16),
            Print(line),
            terminal::Clear(ClearType::UntilNewLine)
        )?;
    }
    queue!(
        out,
        cursor::MoveTo(0, lines.len() as u16),
        terminal::Clear(ClearType::FromCursorDown),
        cursor::MoveTo(0, height.saturating_sub(1) as u16),
        Print(frame::fit(&footer, width))
    )?;
    out.flush()
}

/// The terminal in raw mode on the alternate screen; given back as it was when dropped.
struct Screen;

impl Screen {
    fn enter() -> std::io::Result<Screen> {
        terminal::enable_raw_mode()?;
        // From here on a drop restores the terminal, whatever fails next.
        let screen = Screen;
        execute!(
            std::io::stdout(),
            terminal::EnterAlternateScreen,
            cursor::Hide
        )?;
        Ok(screen)
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = execute!(
            std::io::stdout(),
            cursor::Show,
            terminal::LeaveAlternateScreen
        );
        let _ = terminal::disable_raw_mode();
    }
}
