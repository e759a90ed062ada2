// The REST API; a failure is thrown as the API's error object {message, param, ...}.

export async function api(method, path, body) {
  const init = {method, headers: {Accept: "application/json"}};
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(path, init);
  } catch (e) {
    throw {message: `cannot reach the service (${e.message})`};
  }
  if (!resp.ok) {
    let e = {message: `${path}: HTTP ${resp.status}`};
    try { e = (await resp.json()).error || e; } catch (_) { /* not JSON */ }
    throw e;
  }
  return resp;
}
export const json = async (method, path, body) => (await api(method, path, body)).json();
