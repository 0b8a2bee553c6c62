// Server-sent events with reconnection. While a stream is open the browser reconnects by
// itself and sends Last-Event-ID, so the server resumes where it stopped; when the browser
// gives up (an error status), this reconnects with `urlAfter(lastId)` after a pause.

const MAX_PAUSE_MS = 10000;

/**
 * Follows `url` until `signal` aborts or `isLast(type, data)` says the stream is done.
 * `types`: the event names to listen for (named SSE events do not reach `onmessage`).
 * `onEvent(type, data, id)`, `onState('live' | 'reconnecting' | 'ended')`.
 */
export function follow({ url, urlAfter = () => url, types, onEvent, onState = () => {}, isLast = () => false, signal }) {
  let source = null;
  let lastId = null;
  let pause = 500;
  let finished = false;
  let timer = null;

  const finish = () => {
    finished = true;
    clearTimeout(timer);
    source?.close();
    onState('ended');
  };

  const open = (target) => {
    source = new EventSource(target, { withCredentials: true });
    source.addEventListener('open', () => {
      pause = 500;
      onState('live');
    });
    for (const type of types) {
      source.addEventListener(type, (message) => {
        if (message.lastEventId) lastId = message.lastEventId;
        let data = null;
        try {
          data = JSON.parse(message.data);
        } catch {
          data = message.data;
        }
        onEvent(type, data, message.lastEventId);
        if (isLast(type, data)) finish();
      });
    }
    source.addEventListener('error', () => {
      if (finished) return;
      if (source.readyState === EventSource.CLOSED) {
        onState('reconnecting');
        timer = setTimeout(() => !finished && open(lastId ? urlAfter(lastId) : url), pause);
        pause = Math.min(pause * 2, MAX_PAUSE_MS);
      } else {
        onState('reconnecting');
      }
    });
  };

  signal?.addEventListener('abort', () => {
    finished = true;
    clearTimeout(timer);
    source?.close();
  });
  open(url);
  return { close: finish };
}
