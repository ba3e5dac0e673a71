//! Futures polled again only when a poll can tell something new.
//!
//! A tokio `Sleep` or `Notified` registers the polling task's waker on every poll, although a
//! registration stands until it fires: a `Sleep`'s `AtomicWaker` clones the new waker and drops
//! the old one each time (four atomic read-modify-writes), a `Notified` takes its list's lock
//! (two). A connection's task polls its watchdog timer and the shutdown signal each time it is
//! woken for its socket, and an exchange its deadline each time it is woken for its backend: on
//! every request, to learn nothing. [`Registered`] remembers which task the registration wakes
//! and skips the poll while it stands: the same task polling, and nothing said it may have
//! fired.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// The waker a future's standing registration wakes, by identity (its data and vtable, as
/// `Waker::will_wake` compares them).
///
/// No reference to the waker is held here: the registration holds one until it fires, so while
/// it stands no other waker can come to have this identity.
#[derive(Debug, Default)]
pub(crate) struct Registered(Option<(usize, usize)>);

fn identity(waker: &Waker) -> (usize, usize) {
    (
        waker.data() as usize,
        std::ptr::from_ref(waker.vtable()) as usize,
    )
}

impl Registered {
    /// `poll`'s answer, or `Pending` without calling it when the last poll left a registration
    /// with the waker of `cx` and `news` is false (the registration may have fired). `news`
    /// must be true whenever the registration has fired, so that its firing is not missed.
    pub(crate) fn poll<T>(
        &mut self,
        cx: &mut Context<'_>,
        news: bool,
        poll: impl FnOnce(&mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        let waker = identity(cx.waker());
        if !news && self.0 == Some(waker) {
            return Poll::Pending;
        }
        let polled = poll(cx);
        self.0 = polled.is_pending().then_some(waker);
        polled
    }

    /// The registration no longer stands (its timer was reset): the next poll polls.
    pub(crate) fn forget(&mut self) {
        self.0 = None;
    }
}

/// A timer (tokio's `Sleep`) polled only while it may have fired or is not registered with the
/// task polling it, and reset in place.
#[derive(Debug)]
pub(crate) struct Alarm {
    sleep: Pin<Box<tokio::time::Sleep>>,
    registered: Registered,
}

impl Alarm {
    pub(crate) fn at(deadline: tokio::time::Instant) -> Alarm {
        Alarm {
            sleep: Box::pin(tokio::time::sleep_until(deadline)),
            registered: Registered::default(),
        }
    }

    pub(crate) fn deadline(&self) -> tokio::time::Instant {
        self.sleep.deadline()
    }

    /// Moves it to `deadline`. (A timer that fired has given up its waker, and one reset from
    /// another thread as it fires may have: the next poll registers again.)
    pub(crate) fn reset(&mut self, deadline: tokio::time::Instant) {
        self.sleep.as_mut().reset(deadline);
        self.registered.forget();
    }

    /// Ready once its deadline has passed.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let sleep = &mut self.sleep;
        // A timer that fired is elapsed until it is reset.
        let news = sleep.is_elapsed();
        self.registered.poll(cx, news, |cx| sleep.as_mut().poll(cx))
    }
}

pin_project_lite::pin_project! {
    /// `F`, polled only when `news` says its registration may have fired or it is not
    /// registered with the task polling it (see [`Registered::poll`] for what `news` must say).
    pub(crate) struct Quiet<F, N> {
        #[pin]
        inner: F,
        news: N,
        registered: Registered,
    }
}

impl<F, N> Quiet<F, N> {
    pub(crate) fn new(inner: F, news: N) -> Self {
        Quiet {
            inner,
            news,
            registered: Registered::default(),
        }
    }
}

impl<F: Future, N: FnMut() -> bool> Future for Quiet<F, N> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let news = (this.news)();
        let inner = this.inner;
        this.registered.poll(cx, news, |cx| inner.poll(cx))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;
    use std::time::Duration;

    use super::*;

    /// A waker that counts its wake-ups.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    impl Count {
        fn woken(&self) -> usize {
            self.0.load(Ordering::SeqCst)
        }
    }

    /// Waits `secs` of paused time.
    async fn passes(secs: u64) {
        tokio::time::sleep(Duration::from_secs(secs)).await;
    }

    fn waker() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count::default());
        (count.clone(), Waker::from(count))
    }

    /// Polls `poll` with `waker`, counting the polls that reach the inner future.
    fn polled(
        registered: &mut Registered,
        waker: &Waker,
        news: bool,
        inner_polls: &mut usize,
    ) -> Poll<()> {
        let mut cx = Context::from_waker(waker);
        registered.poll(&mut cx, news, |_| {
            *inner_polls += 1;
            Poll::Pending
        })
    }

    #[test]
    fn a_standing_registration_is_polled_again_only_with_news_or_another_waker() {
        let (_, a) = waker();
        let (_, b) = waker();
        let mut registered = Registered::default();
        let mut inner = 0;
        let _ = polled(&mut registered, &a, false, &mut inner);
        let _ = polled(&mut registered, &a, false, &mut inner);
        assert_eq!(inner, 1, "the same waker, nothing new: not polled again");
        let _ = polled(&mut registered, &a.clone(), false, &mut inner);
        assert_eq!(inner, 1, "a clone of the same waker wakes the same task");
        let _ = polled(&mut registered, &a, true, &mut inner);
        assert_eq!(inner, 2, "news: polled");
        let _ = polled(&mut registered, &b, false, &mut inner);
        assert_eq!(inner, 3, "another waker: polled, to register it");
        let _ = polled(&mut registered, &a, false, &mut inner);
        assert_eq!(inner, 4, "back to the first: polled");
        registered.forget();
        let _ = polled(&mut registered, &a, false, &mut inner);
        assert_eq!(inner, 5, "forgotten: polled");
    }

    #[test]
    fn a_ready_poll_leaves_no_registration() {
        let (_, a) = waker();
        let mut registered = Registered::default();
        let mut cx = Context::from_waker(&a);
        let mut polls = 0;
        let ready = registered.poll(&mut cx, false, |_| {
            polls += 1;
            Poll::Ready(())
        });
        assert!(ready.is_ready());
        let pending = registered.poll(&mut cx, false, |_| {
            polls += 1;
            Poll::<()>::Pending
        });
        assert!(pending.is_pending());
        assert_eq!(polls, 2, "after a ready poll, the next one polls");
    }

    /// On paused time: an alarm polled many times by one task wakes it once at its deadline
    /// and is then ready; reset after firing, it wakes it again at the new one; moved earlier
    /// before firing, it fires at the earlier deadline.
    #[tokio::test(start_paused = true)]
    async fn an_alarm_polled_seldom_still_wakes_its_task_at_its_deadline() {
        let (count, w) = waker();
        let mut cx = Context::from_waker(&w);
        let in_secs = |secs| tokio::time::Instant::now() + Duration::from_secs(secs);
        let mut alarm = Alarm::at(in_secs(10));
        for _ in 0..5 {
            assert!(alarm.poll(&mut cx).is_pending());
        }
        passes(9).await;
        assert_eq!(count.woken(), 0);
        assert!(alarm.poll(&mut cx).is_pending());
        passes(2).await;
        assert_eq!(count.woken(), 1, "woken at the deadline");
        assert!(alarm.poll(&mut cx).is_ready());

        alarm.reset(in_secs(5));
        assert!(alarm.poll(&mut cx).is_pending());
        assert!(alarm.poll(&mut cx).is_pending());
        passes(6).await;
        assert_eq!(count.woken(), 2, "woken again after the reset");
        assert!(alarm.poll(&mut cx).is_ready());

        alarm.reset(in_secs(60));
        assert!(alarm.poll(&mut cx).is_pending());
        alarm.reset(in_secs(1));
        assert!(alarm.poll(&mut cx).is_pending());
        passes(2).await;
        assert_eq!(count.woken(), 3, "moved earlier, woken then");
        assert!(alarm.poll(&mut cx).is_ready());
    }

    /// An alarm polled by a second task after the first is registered with the second: it
    /// wakes the task that polled last.
    #[tokio::test(start_paused = true)]
    async fn an_alarm_polled_by_another_task_wakes_that_one() {
        let (first, a) = waker();
        let (second, b) = waker();
        let mut alarm = Alarm::at(tokio::time::Instant::now() + Duration::from_secs(1));
        assert!(alarm.poll(&mut Context::from_waker(&a)).is_pending());
        assert!(alarm.poll(&mut Context::from_waker(&b)).is_pending());
        passes(2).await;
        assert_eq!(first.woken(), 0);
        assert_eq!(second.woken(), 1);
    }

    /// A quiet wait for a watch's change is polled once while nothing changes, and still ends
    /// when the change comes.
    #[tokio::test]
    async fn a_quiet_wait_for_shutdown_ends_when_it_comes() {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let probe = rx.clone();
        let mut rx = rx;
        let (count, w) = waker();
        let mut cx = Context::from_waker(&w);
        let mut stopping = std::pin::pin!(Quiet::new(rx.wait_for(|stop| *stop), || {
            probe.has_changed().unwrap_or(true)
        }));
        for _ in 0..3 {
            assert!(stopping.as_mut().poll(&mut cx).is_pending());
        }
        tx.send(true).unwrap();
        assert_eq!(count.woken(), 1, "the change woke the task");
        assert!(stopping.as_mut().poll(&mut cx).is_ready());
    }
}
