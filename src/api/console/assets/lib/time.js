// Times in the browser's zone, with the UTC instant on hover and the age beside it.

// Compact: the day and the minute, the year only when it is not this one (the UTC instant
// to the second is on hover). A table's column of them stays narrow.
const thisYear = new Intl.DateTimeFormat(undefined, { month: 'short', day: 'numeric', hour: 'numeric', minute: '2-digit' });
const otherYear = new Intl.DateTimeFormat(undefined, { dateStyle: 'medium', timeStyle: 'short' });
const relative = new Intl.RelativeTimeFormat(undefined, { numeric: 'auto' });
const STEPS = [[60, 'second'], [60, 'minute'], [24, 'hour'], [30, 'day'], [12, 'month'], [Infinity, 'year']];

/** How long ago (or from now) `date` is, in words: "3 minutes ago", "in 2 hours". */
export function age(date, now = Date.now()) {
  let amount = (date.getTime() - now) / 1000;
  for (const [size, unit] of STEPS) {
    if (Math.abs(amount) < size) return relative.format(Math.round(amount), unit);
    amount /= size;
  }
  return '';
}

/** A `<time>` element for an RFC 3339 instant, or an empty string for none. */
export function when(iso) {
  if (!iso) return '';
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return iso;
  const node = document.createElement('time');
  node.dateTime = iso;
  node.title = `${date.toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z')} (UTC)`;
  node.textContent = told(date);
  return node;
}

function told(date) {
  const local = date.getFullYear() === new Date().getFullYear() ? thisYear : otherYear;
  return `${local.format(date)} · ${age(date)}`;
}

/** How often the ages on a page are told again: "now" becomes "1 minute ago". */
const AGE_REFRESH_MS = 15000;

setInterval(() => {
  for (const node of document.querySelectorAll('time[datetime]')) {
    const date = new Date(node.dateTime);
    if (!Number.isNaN(date.getTime())) node.textContent = told(date);
  }
}, AGE_REFRESH_MS);
